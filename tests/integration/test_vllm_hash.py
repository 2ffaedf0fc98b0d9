"""The identifier the pod computes for a vLLM consumer equals what vLLM 0.34.0's own code computes.

The reference is the released wheel's code (tests/support/vllm_harness.py): ``ImageMediaIO``
decodes each file as vLLM's OpenAI server does, ``ProcessorInputs.get_mm_hashes`` applies the uuid
rule and the hash factors, ``MultiModalHasher`` writes the digest. The pod's side
(:mod:`encoder_pod.vllm_epd`) never imports vllm.
"""

from __future__ import annotations

import itertools
import types
from typing import Any

import pytest

from encoder_pod.vllm_epd.images import vllm_image
from encoder_pod.vllm_epd.mm_hash import ALGORITHMS, hash_factors, identifier
from tests.support.image_corpus import image_corpus
from tests.support.vllm_harness import vllm_release

pytestmark = pytest.mark.integration

CORPUS = list(image_corpus(3))
MODEL_IDS = ["Qwen/Qwen2.5-VL-7B-Instruct", "/models/qwen2-vl tiny/", "模型"]
KWARGS: list[tuple[dict[str, Any] | None, dict[str, Any] | None]] = [
    (None, None),
    ({"max_pixels": 200704}, None),
    ({"images_kwargs": {"min_pixels": 3136}, "videos_kwargs": {"fps": 2}}, None),  # the video scope is no factor of an image
    ({"videos_kwargs": {"fps": 1.5}}, None),  # only another modality's: no factor at all, the uuid stays verbatim
    (None, {"image": {"rgba_background_color": [0, 0, 0]}}),
    (None, {"video": {"num_frames": 8}}),  # another modality's media_io_kwargs: no factor
    ({"do_resize": True, "size": {"longest_edge": 512}}, {"image": {"rgba_background_color": [10, 20, 30], "extra": None}}),
]


def vllm_identifiers(release: Any, algorithm: str, model_id: str, files: list[bytes], uuids: list[str | None],
                     processor: dict[str, Any] | None, media_io: dict[str, Any] | None) -> list[str]:
    """What vLLM's renderer computes for one request's images."""
    image_io = release.image_io.ImageMediaIO(**(media_io or {}).get("image", {}))
    items = [image_io.load_bytes(data) for data in files]
    data_items = {"image": types.SimpleNamespace(get_all_items_for_hash=lambda: items)}
    inputs = types.SimpleNamespace(mm_data_items=data_items, mm_uuid_items={"image": uuids}, hf_processor_mm_kwargs=processor or {},
                                   media_io_kwargs=media_io or {})
    return list(release.get_mm_hashes(inputs, model_id, algorithm)["image"])


def pod_identifiers(algorithm: str, model_id: str, files: list[bytes], uuids: list[str | None],
                    processor: dict[str, Any] | None, media_io: dict[str, Any] | None) -> list[str]:
    factors = hash_factors("image", processor, media_io)
    from encoder_pod.vllm_epd.images import background_colour

    background = background_colour((media_io or {}).get("image"), "media_io_kwargs.image")
    return [identifier(algorithm, model_id, "image", uuid, vllm_image(data, 10**8, background).hash_item, factors)
            for data, uuid in zip(files, uuids)]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_content_hash_of_every_corpus_image_equals_vllms(algorithm: str):
    release = vllm_release()
    files = [data for _, data in CORPUS]
    names = [name for name, _ in CORPUS]
    checked = 0
    for model_id, (processor, media_io) in itertools.product(MODEL_IDS, KWARGS):
        ours = pod_identifiers(algorithm, model_id, files, [None] * len(files), processor, media_io)
        theirs = vllm_identifiers(release, algorithm, model_id, files, [None] * len(files), processor, media_io)
        for name, a, b in zip(names, ours, theirs):
            assert a == b, f"{name} ({model_id!r}, {processor}, {media_io}): ours {a} != vLLM's {b}"
            checked += 1
        assert len(set(ours)) == len(files)  # every file its own key
    assert checked == len(CORPUS) * len(MODEL_IDS) * len(KWARGS) == 54 * 3 * 7


def test_uuids_verbatim_or_hashed_with_the_request_kwargs_as_vllm_does():
    release = vllm_release()
    files = [data for _, data in CORPUS[:6]]
    uuids = ["img-a", None, "sha256-of-url", "img-a", "lora:abc", None]
    for algorithm, (processor, media_io) in itertools.product(ALGORITHMS, KWARGS):
        ours = pod_identifiers(algorithm, "m", files, uuids, processor, media_io)
        theirs = vllm_identifiers(release, algorithm, "m", files, uuids, processor, media_io)
        assert ours == theirs, (processor, media_io)
        if hash_factors("image", processor, media_io):
            assert "img-a" not in ours
        else:
            assert ours[0] == ours[3] == "img-a" and ours[4] == "lora:abc"


def test_conversions_are_hash_factors_and_the_background_colour_too():
    """Same bytes, another rgba_background_color: a converted image gets another key, an RGB one the same."""
    rgba = dict(CORPUS)["rgba-png-0"]
    rgb = dict(CORPUS)["rgb-png-0"]
    white = pod_identifiers("blake3", "m", [rgba, rgb], [None, None], None, None)
    black = pod_identifiers("blake3", "m", [rgba, rgb], [None, None], None, {"image": {"rgba_background_color": [0, 0, 0]}})
    assert white[0] != black[0]
    # media_io_kwargs is a factor of every image item, converted or not
    assert white[1] != black[1]


def test_decoded_pixels_equal_vllms():
    """The pixels the pod encodes are the ones vLLM's ImageMediaIO hands its processor (rotation, composite)."""
    import numpy as np

    release = vllm_release()
    for name, data in CORPUS:
        for background in ((255, 255, 255), (0, 64, 128)):
            ours = vllm_image(data, 10**8, background).image
            theirs = release.image_io.ImageMediaIO(rgba_background_color=list(background)).load_bytes(data).media
            assert ours.mode == theirs.mode == "RGB", name
            assert ours.size == theirs.size, name
            assert np.array_equal(np.asarray(ours), np.asarray(theirs)), name
