"""Unit tests of the e2e infrastructure's pure parts (tests/e2e/cluster)."""
