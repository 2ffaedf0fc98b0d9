"""Where an embedding goes once encoded: back in the HTTP response (inline) or pushed to prefill.

Adding a backend whose prefill ranks call back (as receive URLs and mooncake's pulls do): declare
its control operations once in its own module, as a tuple of
:class:`~encoder_pod.transfer.control.ControlOp` (name, path and methods, the handler on the
object that holds its state, the TRANSFER_BACKEND values that serve it, its one refusal, the
req_id its calls route by), and add that tuple to ``CONTROL_OPS`` in
:mod:`~encoder_pod.transfer.registry`: that is its one registration. The HTTP routes, the gRPC
face (``engine.control(name, body)``), the data-parallel front and worker (one ``Call`` message
by name) and the :class:`~encoder_pod.transfer.router.TransferRouter` route by name and need no
change. A new TRANSFER_BACKEND value is still a member of ``settings.TransferBackend``, and the
router still builds its objects: the one that delivers a request (``for_request``) and the one
whose state its operations work on (listed in the router's owners).
"""
