"""The lifecycle core: one rollout, open → step × N → close, in plain asyncio.

Hooks, limits, tasks, harnesses, the runtime interface, the model boundary (session and
interception), the policy version and pause, the rollout and its phases. How many rollouts
share a process is ``_hosting``'s business. Every lifecycle rule (B1–B55) is tested here
without Ray. Imports only ``_record`` and ``_errors``.
"""
