"""Qwen2-VL / Qwen2.5-VL video on tiny checkpoints: temporal patches, grids, rows per clip."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from encoder_pod.modality import Modality
from encoder_pod.models.base import MediaItem, VideoClip
from encoder_pod.models.qwen2_vl import VIDEO_CONFIG, video_patches
from tests.support.media_files import video_frames

pytestmark = pytest.mark.integration

QWEN_ARCHS = ("qwen2_vl", "qwen2_5_vl")


def _clip(count: int, width: int, height: int, seed: int = 0) -> MediaItem:
    return MediaItem(Modality.VIDEO, VideoClip(frames=video_frames(count, width, height, seed), fps=2.0))


def encode(adapter, requests):
    batch = adapter.preprocess(requests)
    return batch, adapter.postprocess(adapter.forward(batch), batch)


def _hf_video_patchify(videos: torch.Tensor, patch: int, merge: int, temporal: int) -> torch.Tensor:
    """Qwen2VLVideoProcessor.patchify (transformers 5.23), restated: that module imports torchvision."""
    batch, frames, channel, height, width = videos.shape
    if pad := -frames % temporal:
        videos = torch.cat((videos, videos[:, -1:].expand(-1, pad, -1, -1, -1)), dim=1)
        frames += pad
    gt, gh, gw = frames // temporal, height // patch, width // patch
    patches = videos.view(batch, gt, temporal, channel, gh // merge, merge, patch, gw // merge, merge, patch)
    patches = patches.permute(0, 1, 4, 7, 5, 8, 3, 2, 6, 9)
    return patches.reshape(batch, gt * gh * gw, channel * temporal * patch * patch)


@pytest.mark.parametrize("count", [1, 2, 3, 4, 5])
def test_temporal_patches_are_laid_out_as_the_video_processor_does(count, tiny_adapter):
    adapter = tiny_adapter("qwen2_vl")
    proc = adapter.processor
    # 56x56 frames need no resize (a multiple of 28 within the bounds): only the layout is compared.
    frames = video_frames(count, 56, 56, seed=count)
    out = proc(images=list(frames), return_tensors="pt", input_data_format="channels_last", **adapter.video_kwargs)
    ours, t = video_patches(out["pixel_values"], count, proc.temporal_patch_size, proc.patch_size)
    mean = torch.tensor(proc.image_mean).view(1, 1, 3, 1, 1)
    std = torch.tensor(proc.image_std).view(1, 1, 3, 1, 1)
    normalized = (torch.from_numpy(frames).permute(0, 3, 1, 2)[None].float() / 255 - mean) / std
    expected = _hf_video_patchify(normalized, proc.patch_size, proc.merge_size, proc.temporal_patch_size)[0]
    assert t == -(-count // 2)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", QWEN_ARCHS)
def test_grids_rows_and_batched_clips(arch, tiny_adapter):
    adapter = tiny_adapter(arch)
    # tiny video bounds: 56*56 .. 112*112 pixels per frame, factor 28, temporal patch 2.
    clips = [_clip(4, 64, 48, seed=1), _clip(3, 100, 40, seed=2), _clip(1, 320, 240, seed=3)]
    expected = [[2, 4, 4], [2, 2, 8], [1, 6, 8]]
    batch, (part,) = encode(adapter, [clips])
    assert batch.item_grids == [expected]
    assert batch.item_tokens == [[t * h * w // 4 for t, h, w in expected]] == [[adapter.measure(c) for c in clips]]
    assert part.embedding.shape == (sum(batch.item_tokens[0]), adapter.hidden_size)
    start = 0
    for clip, rows in zip(clips, batch.item_tokens[0]):
        _, (alone,) = encode(adapter, [[clip]])
        torch.testing.assert_close(part.embedding[start : start + rows], alone.embedding, atol=1e-5, rtol=1e-4)
        start += rows


@pytest.mark.parametrize("arch", QWEN_ARCHS)
def test_a_still_clip_encodes_like_the_image(arch, tiny_adapter):
    """Two equal frames fill one temporal patch exactly as the image processor fills it for a still."""
    adapter = tiny_adapter(arch)
    frame = video_frames(1, 56, 56, seed=5)[0]
    clip = MediaItem(Modality.VIDEO, VideoClip(frames=np.stack([frame, frame]), fps=2.0))
    _, (video,) = encode(adapter, [[clip]])
    _, (image,) = encode(adapter, [[MediaItem(Modality.IMAGE, Image.fromarray(frame))]])
    torch.testing.assert_close(video.embedding, image.embedding, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("arch", QWEN_ARCHS)
def test_video_health_item(arch, tiny_adapter):
    adapter = tiny_adapter(arch)
    item = adapter.health_item(Modality.VIDEO)
    assert item.data.frames.shape == (2, 32, 32, 3)
    batch, (part,) = encode(adapter, [[item]])
    assert part.embedding.shape[0] == adapter.measure(item) == 4


def test_refused_clips(tiny_adapter):
    adapter = tiny_adapter("qwen2_vl")
    bad = {
        "must be a decoded clip": MediaItem(Modality.VIDEO, np.zeros((2, 8, 8, 3), np.uint8)),
        r"\(frames, height, width, 3\) uint8": MediaItem(Modality.VIDEO, VideoClip(np.zeros((2, 8, 8), np.uint8), 2.0)),
        "aspect ratio": MediaItem(Modality.VIDEO, VideoClip(np.zeros((2, 1, 300, 3), np.uint8), 2.0)),
    }
    for words, item in bad.items():
        with pytest.raises(ValueError, match=words):
            adapter.measure(item)


@pytest.mark.parametrize("arch", ["clip", "siglip", "llava_next"])
def test_other_image_families_refuse_video(arch, tiny_adapter):
    with pytest.raises(ValueError, match="encodes IMAGE items, not VIDEO"):
        tiny_adapter(arch).measure(_clip(2, 32, 32))


def _copy(tiny_model, tmp_path) -> Path:
    return Path(shutil.copytree(tiny_model("qwen2_vl"), tmp_path / "qwen2_vl"))


def test_video_bounds_come_from_the_video_processor_config(tiny_model, load_checkpoint, tmp_path):
    path = _copy(tiny_model, tmp_path)
    config = json.loads((path / VIDEO_CONFIG).read_text())
    config["size"] = {"shortest_edge": 28 * 28, "longest_edge": 56 * 56}
    (path / VIDEO_CONFIG).write_text(json.dumps(config))
    adapter = load_checkpoint(path)
    clip = _clip(2, 320, 240)
    # At most 56*56 pixels: 240x320 shrinks to 28x56, a 2x4 patch grid, 2 merged rows.
    assert adapter.preprocess([[clip]]).item_grids == [[[1, 2, 4]]]
    assert adapter.measure(clip) == 2
    (path / VIDEO_CONFIG).unlink()
    # No video config: Qwen2VLVideoProcessor's class defaults (128*28*28 .. 768*28*28 pixels).
    assert load_checkpoint(path).video_kwargs["size"] == {"shortest_edge": 128 * 28 * 28, "longest_edge": 768 * 28 * 28}


def test_video_config_that_does_not_fit_is_refused(tiny_model, load_checkpoint, tmp_path):
    path = _copy(tiny_model, tmp_path)
    config = json.loads((path / VIDEO_CONFIG).read_text())
    config["temporal_patch_size"] = 4
    (path / VIDEO_CONFIG).write_text(json.dumps(config))
    with pytest.raises(RuntimeError, match="temporal_patch_size 4 differs"):
        load_checkpoint(path)


# --- Qwen3-VL video: bounds over the whole clip, timestamps; Qwen2.5-VL: seconds per grid ----------

def test_qwen3_video_size_is_bounded_over_the_whole_clip(tiny_full_model, load_checkpoint):
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize as qwen3_rule
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as per_frame_rule

    adapter = load_checkpoint(tiny_full_model("qwen3_vl"), ENCODER_DEVICE="cpu")
    size = adapter.video_kwargs["size"]
    for count, width, height in [(5, 100, 80), (8, 320, 240), (2, 64, 64), (3, 500, 90)]:
        clip = _clip(count, width, height)
        h, w = qwen3_rule(count, height, width, 2, 32, size["shortest_edge"], size["longest_edge"])
        expected = [-(-count // 2), h // 16, w // 16]
        batch = adapter.preprocess([[clip]])
        assert batch.item_grids == [[expected]] and adapter.measure(clip) == expected[0] * expected[1] * expected[2] // 4
    # The per-frame rule of Qwen2-VL would give another grid for the long clip: the rules differ.
    h, w = per_frame_rule(240, 320, factor=32, min_pixels=size["shortest_edge"], max_pixels=size["longest_edge"])
    assert [h // 16, w // 16] != adapter.preprocess([[_clip(8, 320, 240)]]).item_grids[0][0][1:]
    with pytest.raises(ValueError, match="at least 2 frames"):
        adapter.measure(_clip(1, 64, 64))


def test_qwen3_video_timestamps_are_the_processors(tiny_full_model, load_checkpoint):
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

    adapter = load_checkpoint(tiny_full_model("qwen3_vl"), ENCODER_DEVICE="cpu")
    sampled = VideoClip(video_frames(5, 64, 64, seed=1), fps=0.5, indices=(0, 48, 96, 144, 192), source_fps=24.0)
    unknown = VideoClip(video_frames(4, 64, 64, seed=2), fps=2.0)
    batch = adapter.preprocess([[MediaItem(Modality.VIDEO, sampled), MediaItem(Modality.VIDEO, unknown)]])
    # _calculate_timestamps does not use its processor: called unbound with the clip's source positions.
    expected = Qwen3VLProcessor._calculate_timestamps(None, [0, 48, 96, 144, 192], 24.0, 2)
    assert batch.request_extras == [{"video_timestamps": [expected, [0.25, 1.25]]}]
    assert len(expected) == batch.item_grids[0][0][0]  # one timestamp per temporal grid


def test_qwen2_5_video_sends_seconds_per_grid_and_qwen2_nothing(tiny_adapter):
    clips = [_clip(4, 64, 48, seed=1), MediaItem(Modality.VIDEO, VideoClip(video_frames(3, 64, 48, seed=2), fps=1.5))]
    assert tiny_adapter("qwen2_5_vl").preprocess([clips]).request_extras == [{"second_per_grid_ts": [1.0, 2 / 1.5]}]
    assert tiny_adapter("qwen2_vl").preprocess([clips]).request_extras == [{}]
    batch = tiny_adapter("qwen2_5_vl").preprocess([[_clip(2, 56, 56)], [_clip(2, 56, 56)]])
    parts = tiny_adapter("qwen2_5_vl").postprocess(tiny_adapter("qwen2_5_vl").forward(batch), batch)
    assert [p.extras for p in parts] == [{"second_per_grid_ts": [1.0]}] * 2
