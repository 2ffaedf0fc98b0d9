"""SGLang dynamic discovery: the pod registers itself with prefill-side bootstrap servers."""

from encoder_pod.discovery.registrar import Registrar, advertised_url

__all__ = ["Registrar", "advertised_url"]
