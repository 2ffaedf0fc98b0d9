"""The peer comparison's parts (bench/peer_bench.py): peers' venvs, servers, reference outputs, rounds."""
