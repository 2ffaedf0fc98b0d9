"""OpenAPI description of the /encode body (parsing itself is in encoder_pod.protocol)."""

from __future__ import annotations

ENCODE_OPENAPI = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["req_id", "mm_items", "modality"],
                    "properties": {
                        "req_id": {"type": "string", "description": "Unique per part, e.g. <rid>_local_part_<k>."},
                        "mm_items": {
                            "type": "array",
                            "description": "URL, data: URI, raw base64 or file path per item (nested lists flattened).",
                            "items": {},
                        },
                        "modality": {"type": "string", "enum": ["IMAGE", "AUDIO", "VIDEO"]},
                        "num_parts": {"type": "integer", "minimum": 1, "default": 1},
                        "part_idx": {"type": "integer", "minimum": 0, "default": 0},
                        "prefill_host": {"type": "string", "nullable": True},
                        "embedding_port": {
                            "description": "int (zmq_to_tokenizer), list of ints (zmq_to_scheduler) or null.",
                            "oneOf": [{"type": "integer"}, {"type": "array", "items": {"type": "integer"}}],
                            "nullable": True,
                        },
                        "hashes": {"type": "array", "items": {}},
                        "encoder_idx": {"description": "Echoed back."},
                    },
                }
            }
        },
    },
    "responses": {
        "200": {"description": "null for the ZMQ backends; the embedding for inline."},
        "400": {"description": "Invalid request or item; the message names the field or item index."},
        "409": {"description": "Duplicate in-flight req_id."},
        "413": {"description": "Body above ENCODER_MAX_REQUEST_BYTES."},
        "429": {"description": "Queue full."},
        "503": {"description": "Not ready or shutting down."},
        "504": {"description": "Timed out after ENCODER_REQ_TIMEOUT."},
    },
}
