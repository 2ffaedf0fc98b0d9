"""Ray Serve serving the pod's CLIP tower with ``@serve.batch`` (a script for Ray's own venv).

Run as ``python bench/peers/ray_app.py --model DIR --port P --keep-layers N --temp-dir DIR``
(``--device cuda`` on a GPU). It starts a local
Ray (no dashboard, no usage stats), deploys one replica at ``/encode`` that takes the encoder
pod's request body (``{"req_id", "modality": "IMAGE", "mm_items": [data URI]}``), and answers
as the pod's inline answer does: the patch rows as base64 of the tensor's little-endian bytes.
The replica loads the same ``CLIPVisionModel`` with transformers' PIL image processor, keeps the
same encoder layers the pod keeps (LLaVA's penultimate layer) and drops CLS, so both compute the
same rows. The handler is written as Ray's ``@serve.batch`` documentation shows: decode on the
replica's event loop, the batched forward inside the batch method. It blocks until SIGTERM or
SIGINT, then shuts Serve and Ray down.
"""

from __future__ import annotations

import argparse
import base64
import io
import signal
import threading
from typing import Any

import numpy as np
import ray
import torch
from PIL import Image
from ray import serve
from starlette.requests import Request
from transformers import CLIPImageProcessorPil, CLIPVisionModel


def _rows_bytes(rows: torch.Tensor) -> tuple[str, bytes]:
    """(dtype name, little-endian bytes) as the pod's inline answer carries them."""
    if rows.dtype == torch.bfloat16:
        return "bfloat16", rows.contiguous().view(torch.int16).cpu().numpy().astype("<i2").tobytes()
    return "float32", rows.float().cpu().numpy().astype("<f4").tobytes()


@serve.deployment(max_ongoing_requests=64, ray_actor_options={"num_cpus": 1},
                  logging_config={"enable_access_log": False})
class ClipTower:
    """One replica: processor + tower, a batched forward of up to ``max_batch`` images."""

    def __init__(self, model_dir: str, device: str, threads: int, keep_layers: int, max_batch: int,
                 wait_s: float) -> None:
        self.threads = threads
        torch.set_num_threads(threads)  # Ray sets OMP_NUM_THREADS to the actor's num_cpus
        self.device = torch.device(device)
        self.dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.processor = CLIPImageProcessorPil.from_pretrained(model_dir)
        model = CLIPVisionModel.from_pretrained(model_dir, dtype=self.dtype).to(self.device).eval()
        tower = getattr(model, "vision_model", model)  # transformers 5: the model is the tower
        tower.encoder.layers = tower.encoder.layers[:keep_layers]
        self.model = model
        self.encode_batch.set_max_batch_size(max_batch)
        self.encode_batch.set_batch_wait_timeout_s(wait_s)

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.01)
    async def encode_batch(self, images: list[Image.Image]) -> list[torch.Tensor]:
        """One processor call and one forward for the batch; the patch rows of each image."""
        if torch.get_num_threads() != self.threads:  # user code may run on a thread of its own
            torch.set_num_threads(self.threads)
        pixels = self.processor(images=images, return_tensors="pt")["pixel_values"]
        with torch.inference_mode():
            hidden = self.model(pixel_values=pixels.to(self.device, self.dtype)).last_hidden_state[:, 1:]
        return list(hidden)

    async def __call__(self, request: Request) -> dict[str, Any]:
        """The pod's request body in, an inline-style answer out."""
        body = await request.json()
        uri = body["mm_items"][0]
        image = Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))).convert("RGB")
        rows = await self.encode_batch(image)
        dtype, raw = _rows_bytes(rows)
        return {"status": "ok", "req_id": body.get("req_id"), "modality": "IMAGE",
                "embedding": {"dtype": dtype, "shape": list(rows.shape), "encoding": "base64",
                              "data": base64.b64encode(raw).decode("ascii")},
                "item_token_counts": [int(rows.shape[0])]}


def main() -> None:
    """Start Ray and Serve, deploy, wait for a signal, shut down."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--keep-layers", type=int, required=True)
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--batch-wait-s", type=float, default=0.01)
    parser.add_argument("--temp-dir", required=True, help="Ray's session folder (a short path: its sockets live there)")
    args = parser.parse_args()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    ray.init(num_cpus=max(2, args.threads), num_gpus=1 if args.device == "cuda" else 0,
             include_dashboard=False, log_to_driver=True, _temp_dir=args.temp_dir)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": args.port})
        options = {"num_cpus": 1, "num_gpus": 1 if args.device == "cuda" else 0}
        app = ClipTower.options(ray_actor_options=options).bind(  # type: ignore[attr-defined]
            args.model, args.device, args.threads, args.keep_layers, args.max_batch, args.batch_wait_s)
        serve.run(app, name="clip", route_prefix="/encode")
        print("ray serve ready", flush=True)
        stop.wait()
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
