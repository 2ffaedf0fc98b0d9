"""Hub ids as model paths: ``org/name[@revision]`` resolved from the Hugging Face cache first.

``--model-path Qwen/Qwen2.5-VL-7B-Instruct@<rev>`` (``hf://`` accepted) is looked up in the local
Hugging Face cache (``HF_HOME`` / ``HF_HUB_CACHE``, or ``cache_dir``) through ``huggingface_hub``
itself, with ``local_files_only``: a pod whose init container fetched the model, or that runs with
``HF_HUB_OFFLINE=1``, never touches the network. Only when the cache lacks a needed file and
offline mode is off is anything downloaded, and then only what the encoder needs: ``config.json``,
the processor and tokenizer files, the index, and the shards that hold the tower and projector
(chosen from the index's weight map by the family's own key plan); ``HF_TOKEN`` is sent when set.

No torch at import: the CLI's ``fetch-model`` imports the family code only once config.json is
known. A local directory is never taken for a hub id (it is checked first).
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from encoder_pod.settings import ENV_PREFIX, ModelPathError, ModelSettings, SettingsError

log = logging.getLogger(__name__)

SCHEME = "hf://"
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_SNAPSHOT = re.compile(r"models--(?P<org>[^/]+?)--(?P<name>[^/]+)/snapshots/(?P<commit>[0-9a-f]{40})/?$")

META_FILES = (
    "generation_config.json",
    "preprocessor_config.json",
    "video_preprocessor_config.json",
    "processor_config.json",
    "chat_template.json",
    "chat_template.jinja",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    "spk_dict.pt",
)
"""Files fetched besides config.json, the index and the shards, whichever of them the repo has."""
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


class BadHubSpec(SettingsError):
    """``--model-path`` is neither a directory nor ``org/name[@revision]`` (exit code 2)."""


class ModelNotFound(ModelPathError):
    """The hub id cannot be resolved: not cached while offline, unknown, or not authorised (exit code 3)."""


@dataclass(frozen=True)
class HubRef:
    """A model on the hub: its repo id and the revision asked for (branch, tag or commit; None = main)."""

    repo_id: str
    revision: str | None = None

    def __str__(self) -> str:
        return self.repo_id + (f"@{self.revision}" if self.revision else "")


def parse_spec(spec: str, revision: str | None = None) -> HubRef:
    """``[hf://]org/name[@revision]`` -> :class:`HubRef`; ``revision`` (the setting) must agree with ``@rev``."""
    text = spec.strip()
    text = text[len(SCHEME) :] if text.startswith(SCHEME) else text
    repo_id, at, pinned = text.partition("@")
    if not _REPO_ID.match(repo_id) or (at and not pinned) or ".." in repo_id:
        raise BadHubSpec(
            f"invalid setting {ENV_PREFIX}MODEL_PATH / --model-path: {spec!r} is neither a directory nor a hub id "
            "org/name[@revision]"
        )
    if pinned and revision and pinned != revision:
        raise BadHubSpec(
            f"invalid setting {ENV_PREFIX}REVISION / --revision: {revision!r} disagrees with the revision in "
            f"{ENV_PREFIX}MODEL_PATH ({pinned!r})"
        )
    return HubRef(repo_id, pinned or revision or None)


def hub_origin(path: Path) -> dict[str, str] | None:
    """``{"repo_id", "commit"}`` when ``path`` is a snapshot folder of the Hugging Face cache."""
    match = _SNAPSHOT.search(Path(path).as_posix())
    if match is None:
        return None
    return {"repo_id": f"{match['org']}/{match['name']}", "commit": match["commit"]}


def is_local(spec: str) -> bool:
    """A directory on this machine (wins over a hub id of the same spelling)."""
    return bool(spec) and Path(spec).is_dir()


def looks_like_a_path(spec: str) -> bool:
    """A filesystem path, not a hub id: absolute, relative to . or ~, or more than one folder deep."""
    text = spec.strip()
    return text.startswith(("/", "./", "../", "~")) or (not text.startswith(SCHEME) and text.partition("@")[0].count("/") > 1)


EncoderKeys = Callable[[Path, list[str]], list[str]]
"""(checkpoint directory holding config.json, the index's keys) -> the keys serving it reads.

The family code's (``registry.encoder_weight_keys``), passed in: this module sits below the
families and never imports them.
"""


def resolve_model_dir(
    model: ModelSettings, encoder_keys: EncoderKeys, *, download: bool = True, cache_dir: str | None = None
) -> Path:
    """The checkpoint directory for ``model.model_path``: the directory itself, or the cached snapshot.

    A hub id comes from the cache when every file the encoder needs is there; otherwise it is
    downloaded (``download`` and offline mode off) or :class:`ModelNotFound` says which file is missing.
    """
    spec = model.model_path
    if is_local(spec) or looks_like_a_path(spec):
        if not (Path(spec) / "config.json").is_file():
            raise ModelPathError(f"invalid setting {ENV_PREFIX}MODEL_PATH / --model-path: no config.json in {spec!r}")
        return Path(spec)
    if not spec:
        raise ModelPathError(f"invalid setting {ENV_PREFIX}MODEL_PATH / --model-path: not set")
    ref = parse_spec(spec, model.revision)
    return fetch(ref, encoder_keys, cache_dir=cache_dir, download=download)


def fetch(ref: HubRef, encoder_keys: EncoderKeys, *, cache_dir: str | None = None, download: bool = True) -> Path:
    """The snapshot folder holding what the encoder needs of ``ref``: from the cache, else downloaded."""
    from huggingface_hub import constants

    try:
        snapshot = _Fetcher(ref, cache_dir, encoder_keys, local_only=True).run()
        log.info("%s resolved from the local cache: %s", ref, snapshot)
        return snapshot
    except ModelNotFound as missing:
        if not download or constants.HF_HUB_OFFLINE:
            why = "offline mode (HF_HUB_OFFLINE=1)" if constants.HF_HUB_OFFLINE else "downloads are off"
            raise ModelNotFound(f"{missing} ({why})") from None
    log.info("%s is not (completely) cached; downloading the encoder's files", ref)
    return _Fetcher(ref, cache_dir, encoder_keys, local_only=False).run()


class _Fetcher:
    """One resolution of ``ref``: config first (it pins the commit), then meta files, index, shards."""

    def __init__(self, ref: HubRef, cache_dir: str | None, encoder_keys: EncoderKeys, local_only: bool) -> None:
        self.ref = ref
        self.encoder_keys = encoder_keys
        self.local_only = local_only
        self.kwargs: dict[str, Any] = {
            "revision": ref.revision,
            "cache_dir": cache_dir,
            "local_files_only": local_only,
            "token": os.environ.get("HF_TOKEN") or None,
        }

    def run(self) -> Path:
        """The snapshot folder, once every file the encoder needs is in it."""
        config = self._get("config.json", required=True)
        assert config is not None
        snapshot = config.parent
        # snapshots/<commit>: every later file comes from the very commit config.json came from.
        if _COMMIT.match(snapshot.name):
            self.kwargs["revision"] = snapshot.name
        if not self.local_only:
            for name in META_FILES:
                self._get(name, required=False)
        index = self._get(INDEX_NAME, required=False)
        shards = encoder_shards(snapshot, json.loads(index.read_text()), self.encoder_keys) if index else [SINGLE_NAME]
        for shard in shards:
            self._get(shard, required=True)
        return snapshot

    def _get(self, filename: str, required: bool) -> Path | None:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import (
            EntryNotFoundError,
            GatedRepoError,
            HfHubHTTPError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )

        try:
            return Path(hf_hub_download(self.ref.repo_id, filename, **self.kwargs))
        except GatedRepoError:
            raise ModelNotFound(f"{self.ref}: gated repository; set HF_TOKEN to a token that was granted access") from None
        except RepositoryNotFoundError:
            raise ModelNotFound(f"{self.ref}: no such model on the hub, or not authorised (HF_TOKEN)") from None
        except RevisionNotFoundError:
            raise ModelNotFound(f"{self.ref}: no revision {self.ref.revision!r}") from None
        except LocalEntryNotFoundError:
            if not required:
                return None
            reach = "" if self.local_only else " and the hub cannot be reached"
            raise ModelNotFound(f"{self.ref}: {filename} is not in the local cache{reach}") from None
        except EntryNotFoundError:
            if required:
                raise ModelNotFound(f"{self.ref}: the repository has no {filename}") from None
            return None
        except HfHubHTTPError as exc:
            raise ModelNotFound(f"{self.ref}: the hub refused {filename}: {exc}") from None


def encoder_shards(snapshot: Path, index: dict[str, Any], encoder_keys: EncoderKeys) -> list[str]:
    """The shards holding the encoder's tensors (tower + projector), by the family's key plan."""
    mapping = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(mapping, dict) or not mapping:
        raise ModelNotFound(f"{snapshot / INDEX_NAME} has no weight_map")
    try:
        keys = encoder_keys(snapshot, list(mapping))
    except (ValueError, RuntimeError) as exc:
        raise ModelNotFound(f"{snapshot}: {exc}") from None
    return sorted({mapping[key] for key in keys})

