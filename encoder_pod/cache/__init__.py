"""A content-addressed cache of encoder outputs per model replica, with single flight.

- :mod:`~encoder_pod.cache.keys`: what makes two items the same (model namespace, modality,
  content digest).
- :mod:`~encoder_pod.cache.store`: the byte-budgeted LRU.
- :mod:`~encoder_pod.cache.entries`: a request's part cut into items and joined again.
- :mod:`~encoder_pod.cache.lookup`: :class:`ItemCache`, the runtime's one hook (hits, single
  flight, misses computed once).
"""
