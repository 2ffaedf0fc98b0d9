"""Data-parallel mode: N worker processes, each one model replica, behind one HTTP front.

``front`` is the Engine the HTTP edge drives (validate, route, answer); ``worker`` is the process
that hosts an :class:`~encoder_pod.runtime.EncoderRuntime`; ``messages`` is the typed wire between
them, ``ipc`` the sockets, ``router`` the least-pending choice, ``affinity`` the req_id stickiness
zmq_to_scheduler needs, ``handle`` one rank as the front sees it, ``supervisor`` the worker
processes and their watchdog (death, hang, restart with backoff), ``placement`` which device or
CPU share each worker gets, ``ranked_metrics`` every worker's metric families (sent typed) on the
front's registry with a ``rank`` label.
"""
