"""Serving: the HTTP services a rollout's programs talk to, and the upstream model client.

The interception proxy (OpenAI-compatible), the tool server, the node services that host
both for rollouts running in other processes, and ``OpenAIModel``. Imports ``_core``,
``_record`` and ``_errors``.
"""
