"""vLLM's EPD: the pod as the encoder instance of unmodified vLLM prefill instances.

- :mod:`~encoder_pod.vllm_epd.mm_hash`: the identifier a vLLM consumer looks an item up by.
- :mod:`~encoder_pod.vllm_epd.images`: images decoded as vLLM decodes them (what is hashed and encoded).

Nothing here imports vllm.
"""
