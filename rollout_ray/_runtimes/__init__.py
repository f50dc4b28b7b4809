"""Runtimes: the boxes programs run in, and the host that keeps them from outliving it.

``LocalRuntime`` (a private directory on the host, processes tracked by cgroup),
``SandboxRuntime`` (bubblewrap, cgroups, disk limit, routed network) with its filesystem
layout (``layout``), disk limit (``disk``), routes (``routes``) and in-sandbox forwarder;
a task's image: its formats (``image``, ``engine``), unpacking (``unpack``), the node's cache
(``image_cache``) and the filesystem an image sandbox sees (``image_layout``);
what both share: the confined file I/O (``files``) and the cgroups (``cgroup``);
``RuntimeHost`` and its guardian. Imports ``_core``, ``_record`` and ``_errors``.
"""
