"""Tensor parallel: one encoder replica split over a group of ranks (``--tp-size``).

``plans`` (no torch) says whether a checkpoint can be split; ``sharding`` applies PyTorch's
tensor-parallel plans to a loaded tower; ``messages`` is a follower's start argument and the typed
header rank 0 broadcasts before every step; ``group`` runs on rank 0 (the batcher's side) and ``follower`` on ranks 1..T-1.
"""
