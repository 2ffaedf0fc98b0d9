"""Test suite of encoderpool."""
