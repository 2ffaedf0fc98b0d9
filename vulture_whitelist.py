"""Names the dead-code check (vulture, `make lint`) cannot see used: reached by frameworks or callers outside encoder_pod/.

Each line says who uses it. Anything only tests would use does not belong here: it is dead code.
"""

# ruff: noqa
# mypy: ignore-errors
from encoder_pod import json_limits, server
from encoder_pod.api import http_server, json_body
from encoder_pod.batching import admission
from encoder_pod.receiver import client, pull
from encoder_pod.transfer import inline, push_sender

# FastAPI registers route and exception handlers by decorator.
http_server._encoder_error
http_server._internal
http_server._client_gone
http_server.livez
http_server.health_generate
http_server.metrics_route
http_server.server_info
http_server.scheduler_receive_url
http_server.scheduler_receive_meta_data
# uvicorn.Server calls capture_signals and reads should_exit and its config's graceful timeout.
server._Server.capture_signals
server._Server.should_exit
_.timeout_graceful_shutdown
# json.JSONDecoder's scanner reads these attributes; Starlette reads media_type; ASGI passes scope.
json_limits.BoundedDecoder.parse_string
json_limits.BoundedDecoder.parse_array
json_limits.BoundedDecoder.parse_object
json_limits.BoundedDecoder.scan_once
json_body.PiecesResponse.media_type
json_body.PiecesResponse.__call__.scope
# The async context manager protocol.
admission.Permit.__aexit__.exc_type
# Public client API (README): prefill servers and clients call these.
inline.decode_embedding
client.EncoderClient.dispatch
pull.EmbeddingReceiver.rejected
# Read by operators (and tests) to see the socket pool at work.
push_sender.PushSender.open_sockets
# pydantic-settings reads model_config; validators are registered by decorator; a documented setting.
_.model_config
_._split_domains
_._normalise_domains
_._split_urls
_._check_urls
_._check_advertise
_._old_wire_value
# Settings values pydantic parses from the environment.
_.ZMQ_TO_SCHEDULER
_._check_frames
_.image_processor_use_gpu
# Set on library objects that read them: PyAV's decoder, the HF CLIP and LLaVA configs.
_.thread_type
_.use_head
_.num_hidden_layers
_.pre_tokenizer  # the tiny checkpoints' tokenizers.Tokenizer
# Called by uvicorn's HTTP protocols on a request they cannot parse (overridden in api/connections.py).
_.send_400_response
