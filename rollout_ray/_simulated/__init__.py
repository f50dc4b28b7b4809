"""The built-in simulated model: a deterministic OpenAI-compatible server (the embedded
default of ``rollout-ray eval``). Standalone: imports nothing of the package but ``_errors``.
"""
