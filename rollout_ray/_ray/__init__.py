"""The Ray layer: the only folder that imports ``ray``.

One module per actor (rollout, runtime, node services), the remote runtime handle, the
shipment of classes to actors, call coalescing and ``RayExecutor``. Actors are thin: each
wraps a host class of ``_hosting`` or ``_runtimes`` and adds no lifecycle logic. Imports
``_hosting``, ``_serving``, ``_runtimes``, ``_core``, ``_record`` and ``_errors``.
"""
