"""Data-parallel mode: N worker processes, each one model replica, behind one HTTP front.

``front`` is the Engine the HTTP edge drives (validate, route, answer); ``worker`` is the process
that hosts an :class:`~encoder_pod.runtime.EncoderRuntime`; ``messages`` is the typed wire between
them, ``ipc`` the sockets, ``router`` the least-pending choice, ``supervisor`` the worker processes
and their restarts, ``placement`` which device or CPU share each worker gets, ``ranked_metrics``
the merge of every worker's metrics.
"""
