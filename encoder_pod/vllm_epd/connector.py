"""An EC connector for vLLM consumers that reads the embeddings from the pods over HTTP.

Loaded by an unmodified vLLM (0.34.0) prefill instance through its module path::

    --ec-transfer-config '{"ec_connector": "EncoderPoolECConnector",
        "ec_connector_module_path": "encoder_pod.vllm_epd.connector", "ec_role": "ec_consumer",
        "ec_connector_extra_config": {"encoder_urls": "http://pool-0.pool:30000,http://pool-1.pool:30000"}}'

Instead of a shared filesystem, ``has_cache_item`` (scheduler side) asks the pods ``HEAD
/v1/ec_cache/<identifier>`` and the worker's ``start_load_caches`` fetches ``GET`` the stored
safetensors file from the pod that has it, checks its rows against the placeholder count the
scheduler planned, and puts it in the encoder cache on the worker's device. Where the item is:
the pods are asked in the order of the cache-affinity rule (:mod:`encoder_pod.rendezvous`, the
identifier as the item string), so a pool fed by an affinity-routing proxy answers at the first
ask; otherwise the next pods are asked, at most all of them.

``ec_connector_extra_config``: ``encoder_urls`` (a list, or comma separated) or ``encoder_service``
(``host:port`` of the pool's headless Service, resolved to every ready pod's address each
``refresh_s``, 10 s by default), ``timeout_s`` (per request, 5 s) and ``found_ttl_s`` (how long a
positive ``has_cache_item`` is remembered, 30 s). A consumer only: ``save_caches`` stores
nothing, and an ``ec_producer`` role is refused at start.

This module imports vllm (it runs inside the consumer) and nothing of the encoder server.
"""

from __future__ import annotations

import logging
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx
import safetensors.torch
import torch
from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorBase, ECConnectorMetadata, ECConnectorRole

from encoder_pod.rendezvous import affinity_key, score
from encoder_pod.settings import VLLM_RELEASES

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

log = logging.getLogger(__name__)


@dataclass
class PoolLoad:
    """One item the worker loads: its identifier, the rows the scheduler planned, the pods to ask."""

    identifier: str
    num_embeds: int
    endpoints: list[str]


@dataclass
class EncoderPoolECMetadata(ECConnectorMetadata):
    """Scheduler -> worker: what to fetch this step."""

    loads: list[PoolLoad] = field(default_factory=list)


def _urls(value: Any) -> list[str]:
    parts = value if isinstance(value, list) else str(value or "").replace(",", " ").split()
    return [str(p).strip().rstrip("/") for p in parts if str(p).strip()]


class Endpoints:
    """The pods' base URLs: a fixed list, or a headless Service's addresses re-resolved now and then."""

    def __init__(self, extra: dict[str, Any]) -> None:
        self._fixed = _urls(extra.get("encoder_urls"))
        self._service = str(extra.get("encoder_service") or "")
        if not self._fixed and not self._service:
            raise ValueError("EncoderPoolECConnector needs ec_connector_extra_config.encoder_urls or .encoder_service")
        self._refresh_s = float(extra.get("refresh_s", 10.0))
        self._lock = threading.Lock()
        self._resolved: list[str] = []
        self._at = float("-inf")

    def current(self) -> list[str]:
        """Every pod URL now."""
        if self._fixed:
            return self._fixed
        with self._lock:
            if time.monotonic() - self._at >= self._refresh_s:
                host, _, port = self._service.rpartition(":")
                try:
                    infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
                    addresses = sorted({str(info[4][0]) for info in infos})
                    self._resolved = [f"http://[{a}]:{port}" if ":" in a else f"http://{a}:{port}" for a in addresses]
                except OSError as exc:
                    log.warning("resolving %s failed (%s); keeping %d known pods", self._service, exc, len(self._resolved))
                self._at = time.monotonic()
            return list(self._resolved)

    def ordered(self, identifier: str) -> list[str]:
        """The pods in the order the affinity rule ranks them for ``identifier``."""
        key = affinity_key(identifier)
        return sorted(self.current(), key=lambda url: (-score(url, key), url))


class EncoderPoolECConnector(ECConnectorBase):
    """vLLM ``ECConnectorBase`` for consumers: embeddings come from encoder pods over HTTP."""

    def __init__(self, vllm_config: "VllmConfig", role: ECConnectorRole) -> None:
        super().__init__(vllm_config=vllm_config, role=role)
        config = vllm_config.ec_transfer_config
        if config is None:
            raise ValueError("ec_transfer_config must be set for EncoderPoolECConnector")
        if self.is_producer:
            raise ValueError("EncoderPoolECConnector is for consumers (ec_role ec_consumer): the encoder pods are the producers")
        version = getattr(sys.modules.get("vllm"), "__version__", None)
        if version is not None and version not in VLLM_RELEASES:
            log.warning("EncoderPoolECConnector is verified with vLLM %s, not %s", ", ".join(VLLM_RELEASES), version)
        extra = dict(config.ec_connector_extra_config or {})
        self._endpoints = Endpoints(extra)
        self._http = httpx.Client(timeout=float(extra.get("timeout_s", 5.0)))
        self._found_ttl = float(extra.get("found_ttl_s", 30.0))
        self._found: dict[str, tuple[str, float]] = {}
        """identifier -> (pod that has it, when seen); scheduler side only (its one thread)."""
        self._pending: list[PoolLoad] = []

    # --- scheduler side ---------------------------------------------------------------------
    def _locate(self, identifier: str) -> str | None:
        seen = self._found.get(identifier)
        if seen is not None and time.monotonic() - seen[1] < self._found_ttl:
            return seen[0]
        for url in self._endpoints.ordered(identifier):
            try:
                response = self._http.head(f"{url}/v1/ec_cache/{identifier}")
            except httpx.HTTPError as exc:
                log.warning("encoder pod %s unreachable for %s: %s", url, identifier, exc)
                continue
            if response.status_code == 200:
                self._found[identifier] = (url, time.monotonic())
                return url
        self._found.pop(identifier, None)
        return None

    def has_cache_item(self, identifier: str) -> bool:
        """Whether a pod holds the item (the scheduler then plans a load instead of running the encoder)."""
        return self._locate(identifier) is not None

    def update_state_after_alloc(self, request: "Request", index: int) -> None:
        """Queue the load of an item the scheduler found here and allocated encoder-cache room for."""
        identifier = request.mm_features[index].identifier
        url = self._locate(identifier)
        if not self.is_consumer or url is None:
            return
        others = [u for u in self._endpoints.ordered(identifier) if u != url]
        self._pending.append(PoolLoad(identifier, request.get_num_encoder_embeds(index), [url, *others]))

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> ECConnectorMetadata:
        """This step's loads, handed to the workers (and forgotten here)."""
        meta = EncoderPoolECMetadata(loads=self._pending)
        self._pending = []
        return meta

    # --- worker side -----------------------------------------------------------------------
    def start_load_caches(self, encoder_cache: dict[str, torch.Tensor], **kwargs: Any) -> None:
        """Fetch every planned item into ``encoder_cache`` on this worker's device."""
        metadata = self._get_connector_metadata()
        assert isinstance(metadata, EncoderPoolECMetadata)
        device = _device()
        for load in metadata.loads:
            if load.identifier in encoder_cache:
                continue
            tensor = self._fetch(load)
            encoder_cache[load.identifier] = tensor.to(device, non_blocking=True)

    def _fetch(self, load: PoolLoad) -> torch.Tensor:
        problems = []
        for url in load.endpoints:
            try:
                response = self._http.get(f"{url}/v1/ec_cache/{load.identifier}")
            except httpx.HTTPError as exc:
                problems.append(f"{url}: {type(exc).__name__}")
                continue
            if response.status_code != 200:
                problems.append(f"{url}: HTTP {response.status_code}")
                continue
            tensor = safetensors.torch.load(response.content)["ec_cache"]
            if tensor.ndim != 2 or tensor.shape[0] != load.num_embeds:
                raise RuntimeError(f"encoder pod {url} stored {list(tensor.shape)} for {load.identifier}, "
                                   f"but the prompt holds {load.num_embeds} placeholders: the pod and this "
                                   "consumer preprocess differently (processor config, model)")
            return tensor
        raise RuntimeError(f"no encoder pod could deliver {load.identifier} ({'; '.join(problems)})")

    def save_caches(self, encoder_cache: dict[str, torch.Tensor], mm_hash: str, **kwargs: Any) -> None:
        """Nothing: the pods store embeddings, consumers only read them."""

    def shutdown(self) -> None:
        """Close the HTTP client."""
        self._http.close()


def _device() -> str:
    """The worker's device, as vLLM's own example connector picks it."""
    from vllm.platforms import current_platform

    device = str(current_platform.device_type)
    if current_platform.is_cuda_alike():
        device = f"{device}:{current_platform.current_device()}"
    return device


__all__ = ["EncoderPoolECConnector", "EncoderPoolECMetadata", "Endpoints", "PoolLoad"]
