"""Hosting: many rollouts in one process, and the executors that place them.

``RolloutHost`` (K rollouts of ``_core`` in one process), the ``Executor`` interface and
``RolloutSpec``, trace sync with a session served in another process, lazy runtimes, GC
tuning for processes that exist to run rollouts, a node's services (proxy and tool server
for programs in runtimes) and ``LocalExecutor``. Ray-free: the Ray layer and the driver
both stand on it. Imports ``_serving``, ``_runtimes``, ``_harnesses``, ``_core``,
``_record`` and ``_errors``.
"""
