"""The benchmarks' own unit tests: their pure helpers (summaries, round order, /proc parsing, pins).

They live with the benchmarks, not under tests/, because tests/ may not import bench (.importlinter).
"""
