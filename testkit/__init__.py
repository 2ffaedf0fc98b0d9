"""What the tests and the benchmarks share: one place both import, so neither imports the other.

- :mod:`testkit.server`: a real ``encoder-pod serve`` subprocess on a free loopback port.
- :mod:`testkit.media`: deterministic test images as ``data:`` URIs.
- :mod:`testkit.load`: the closed-loop load generator (aiohttp), for tests that need traffic
  during a drain or a hang and for the benchmarks' throughput and latency runs.

It is not part of the ``encoderpool`` distribution (users never need it): it is imported from the
repository root, as ``tests`` and ``bench`` are. It imports neither of them (``.importlinter``).
"""
