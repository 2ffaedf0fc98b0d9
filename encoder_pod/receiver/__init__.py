"""What a prefill server embeds to take embeddings from encoder pods.

- :class:`EmbeddingReceiver` / :class:`AsyncEmbeddingReceiver`: bind a PULL socket, validate each
  message strictly, merge the parts of a request, surface encoder errors and expiries as typed
  errors.
- :class:`EncoderClient` / :func:`plan_parts`: split a request's items over several encoders and
  post the parts (and the receive-URL registrations of zmq_to_scheduler); :func:`plan_affinity_parts`
  and :mod:`encoder_pod.rendezvous`: the cache-affinity rule (rendezvous hashing over a
  pool's ready endpoints).
- :meth:`EncoderClient.encode` / :func:`decode_answer`: the embedding in the /encode answer
  instead of a push, as the wire format in one body (``Accept: application/octet-stream``),
  msgpack or JSON, read as strictly as a push.
- :mod:`encoder_pod.receiver.wire`: the wire format itself (docs/wire-format.md).

Nothing here imports the encoder server: a prefill process pays for torch, pyzmq, msgpack and
httpx only.
"""

from encoder_pod.receiver.assembly import (
    Assembler,
    Completed,
    Failed,
    ModalityEmbedding,
    Outcome,
    ReceivedEmbedding,
    Rejected,
)
from encoder_pod.rendezvous import affinity_key, choose
from encoder_pod.receiver.answers import decode_answer
from encoder_pod.receiver.client import EncoderClient, PartPlan, plan_affinity_parts, plan_parts
from encoder_pod.receiver.errors import (
    DispatchError,
    InconsistentParts,
    MalformedMessage,
    PayloadMismatch,
    ReceiverClosed,
    ReceiverError,
    RemoteEncodeError,
    RequestExpired,
    UnsupportedVersion,
    WaitTimeout,
)
from encoder_pod.receiver.pull import AsyncEmbeddingReceiver, EmbeddingReceiver

__all__ = [
    "Assembler",
    "AsyncEmbeddingReceiver",
    "Completed",
    "DispatchError",
    "EmbeddingReceiver",
    "EncoderClient",
    "Failed",
    "InconsistentParts",
    "MalformedMessage",
    "ModalityEmbedding",
    "Outcome",
    "PartPlan",
    "PayloadMismatch",
    "ReceivedEmbedding",
    "ReceiverClosed",
    "ReceiverError",
    "Rejected",
    "RemoteEncodeError",
    "RequestExpired",
    "UnsupportedVersion",
    "WaitTimeout",
    "affinity_key",
    "choose",
    "decode_answer",
    "plan_affinity_parts",
    "plan_parts",
]
