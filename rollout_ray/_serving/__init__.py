"""Serving: the HTTP services a rollout's programs talk to, and the upstream model client.

The interception proxy (Chat Completions, Responses and Anthropic Messages: ``dialects/``),
the tool server and ``OpenAIModel`` (a node's services, which host both for rollouts of other
processes, are ``_hosting``'s). Imports ``_core``, ``_record`` and ``_errors``.
"""
