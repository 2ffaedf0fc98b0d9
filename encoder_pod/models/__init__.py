"""Encoder adapters: one per model family, behind the contract in base.py."""
