"""Runtimes: the boxes programs run in, and the host that keeps them from outliving it.

``LocalRuntime`` (a private directory on the host), ``SandboxRuntime`` (bubblewrap, cgroups,
routed network) with its cgroup helper and in-sandbox forwarder, ``RuntimeHost`` and its
guardian. Imports ``_core``, ``_record`` and ``_errors``.
"""
