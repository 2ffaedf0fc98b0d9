"""Names the dead-code check (vulture, `make lint`) cannot see used: reached by frameworks, libraries
or callers outside encoder_pod/ and operator/.

Each line says who uses it. Anything only tests would use does not belong here: it is dead code
(the one exception says so: tables a test checks a rendered artifact against). An entry vulture
would not report without this file is stale and fails tests/unit/test_lint_gates.py. Functions
registered by decorator (pydantic validators, FastAPI routes, kopf handlers) need no entry:
`ignore_decorators` in pyproject.toml.
"""

# ruff: noqa
# mypy: ignore-errors
from encoder_pod import json_limits, server, settings
from encoder_pod.api import connections, grpc_encoder, grpc_health
from encoder_pod.batching import admission
from encoder_pod.receiver import client, pull
from encoder_pod.transfer import inline, push_sender
from encoder_pod.vllm_epd import connector
from encoderpool_operator import rbac

# vLLM's scheduler and model runner call the EC connector's methods (ECConnectorBase); the
# TYPE_CHECKING imports name the types of its string annotations.
connector.EncoderPoolECConnector.has_cache_item
connector.EncoderPoolECConnector.update_state_after_alloc
connector.EncoderPoolECConnector.build_connector_meta
connector.EncoderPoolECConnector.start_load_caches
connector.EncoderPoolECConnector.save_caches
connector.VllmConfig
connector.SchedulerOutput
_.scheduler_output
_.mm_hash
# uvicorn.Server calls capture_signals and reads should_exit and its config's graceful timeout.
server._Server.capture_signals
server._Server.should_exit
_.timeout_graceful_shutdown
# grpc.aio calls the servicer methods the generated add_*Servicer_to_server registered (the RPC names).
grpc_encoder.SglangEncoderFace.SchedulerReceiveUrl
grpc_health.HealthFace.Check
grpc_health.HealthFace.Watch
# Called by uvicorn's HTTP protocols on a request they cannot parse (overridden in api/connections.py).
connections._ConnectionLimits.send_400_response
# json.JSONDecoder's scanner reads these attributes.
json_limits.BoundedDecoder.parse_array
json_limits.BoundedDecoder.parse_object
json_limits.BoundedDecoder.scan_once
# The async context manager protocol.
admission.Permit.__aexit__.exc_type
# Public client API (README): prefill servers and clients call these.
inline.decode_embedding
client.EncoderClient.dispatch
pull.EmbeddingReceiver.rejected
# Read by operators (and tests) to see the socket pool at work.
push_sender.PushSender.open_sockets
# pydantic reads model_config.
_.model_config
# Set on library objects that read them: PyAV's decoder, the HF CLIP config, the tiny checkpoints'
# tokenizers.Tokenizer; the Kubernetes client's Configuration; kopf's OperatorSettings.
_.thread_type
_.use_head
_.pre_tokenizer
_.connection_pool_maxsize
_.progress_storage
_.diffbase_storage
_.level
_.request_timeout
_.disabled
# http.server calls the handler's do_GET and log_message, and reads daemon_threads.
_.do_GET
_.log_message
_.daemon_threads
# core/v1 Toleration fields, written to the pod by model_dump.
_.operator
_.effect
_.toleration_seconds
# The chart's RBAC rules are checked against these tables (tests/unit/operator/test_operator_chart.py).
rbac.Rule.verbs
rbac.RULES
rbac.LEASE_RULES
# Tiny generic checkpoints: config fields set for transformers to read; the enumeration is the tests'.
_.layer_types
_.num_key_value_heads
_.num_experts_per_tok
_.vocab_size
_.bos_token
_.unk_token
_.feature_families
# SGLang's IMAGE_PROCESSOR_USE_GPU, accepted for drop-in use: its validator refuses true, so the
# value is always false and no code reads it (it changes no rows, hence no cache key either).
settings.ModelSettings.image_processor_use_gpu
