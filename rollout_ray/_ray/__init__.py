"""The Ray layer: the only folder that imports ``ray``.

The rollout, runtime and node services actors; each channel between an actor and its
caller in two modules, one per side (``rollout_actor`` / ``rollout_client``: the batched runs'
receiver and sender with them; ``node_service_actor`` / ``node_services_client``); what crosses
between them (``wire``: spec shipments out, traces back); the remote runtime handle, call
coalescing and ``RayExecutor``. Actors are thin: each
wraps a host class of ``_hosting`` or ``_runtimes`` and adds no lifecycle logic. Imports
``_hosting``, ``_serving``, ``_runtimes``, ``_core``, ``_record`` and ``_errors``.
"""
