"""The ``rollout-ray`` command: ``eval``, ``report``, ``sweep``, ``serve-model``. The top
layer: it may import every other (``ray`` only through ``_ray``).
"""
