"""A vLLM prefill instance's read of the shared storage, as its ECExampleConnector reads it.

    python ec_consumer.py SHARED_STORAGE_PATH IDENTIFIER [IDENTIFIER...]

Per identifier: the file the connector looks for (``<path>/<identifier>/encoder_cache.safetensors``:
its scheduler asks whether it exists, its worker loads it with ``safetensors.torch.load_file`` and
takes the tensor ``ec_cache``), whether it is there, and the tensors loaded: their names, and the
``ec_cache`` tensor's shape, dtype and base64 of its little-endian bytes. Also what writing to the
path gives (a read-only mount refuses it). Prints one JSON line.
"""

import base64
import json
import os
import sys

import safetensors.torch

FILE_NAME = "encoder_cache.safetensors"


def item(root: str, identifier: str) -> dict:
    path = os.path.join(root, identifier, FILE_NAME)
    out: dict = {"identifier": identifier, "path": path, "exists": os.path.exists(path)}
    if out["exists"]:
        tensors = safetensors.torch.load_file(path, device="cpu")
        out["names"] = sorted(tensors)
        tensor = tensors.get("ec_cache")
        if tensor is not None:
            out.update(shape=list(tensor.shape), dtype=str(tensor.dtype).removeprefix("torch."),
                       data=base64.b64encode(tensor.contiguous().numpy().tobytes()).decode())
    return out


def write_probe(root: str) -> str:
    try:
        with open(os.path.join(root, ".consumer-probe"), "w"):
            return "written"
    except OSError as err:
        return err.strerror or str(err)


root = sys.argv[1]
print(json.dumps({"listing": sorted(os.listdir(root)), "write": write_probe(root),
                  "items": [item(root, identifier) for identifier in sys.argv[2:]]}))
