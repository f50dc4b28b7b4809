"""The lifecycle core: one rollout, open → step × N → close, in plain asyncio.

Hooks, limits, tasks, harnesses, the runtime interface, the model boundary (session and
interception), the rollout and its phases, the host of K rollouts and the executor
interface. Every lifecycle rule (B1–B55) is tested here without Ray. Imports only
``_record`` and ``_errors``.
"""
