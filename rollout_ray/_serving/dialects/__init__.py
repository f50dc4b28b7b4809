"""Dialects: the wire formats an agent may speak to the proxy, one module each.

The proxy (``_serving/proxy``) does the rollout's bookkeeping (its secret, its budgets, the
retries of an SDK, the session); a ``Dialect`` does everything that depends on the format
the agent speaks: the routes it posts to, the header its key rides in, how its request reads
as our ``Request`` plus Chat Completions fields for the upstream, how our ``Response`` reads
back as its JSON answer and its stream of events, its error body and its ids. The format is
chosen by the route the SDK posts to; the harness declares nothing. Each dialect is
translated to the one upstream format (Chat Completions: what vLLM, SGLang and every
OpenAI-compatible server speak) and recorded in the one Trace format, so rewards, hooks,
budgets and token data are the same whatever the agent spoke.

What an agent sent that the upstream cannot express (a hosted tool, a forced tool choice,
an extended-thinking budget...) is dropped and recorded on the model call
(``ModelCall.dropped``, field → why), never refused with a 500; a field of the wrong shape
is a 400 naming it (``WireError.param``).

To add a dialect: a module here with a ``Dialect`` subclass (``dialect.py``), listed in
``all_dialects``.
"""

from __future__ import annotations

from .anthropic import AnthropicMessages
from .chat_completions import ChatCompletions
from .dialect import Dialect, Parsed
from .responses import Responses

__all__ = ["Dialect", "Parsed", "all_dialects"]


def all_dialects() -> tuple[Dialect, ...]:
    """Every dialect the proxy serves, Chat Completions first."""
    return (ChatCompletions(), Responses(), AnthropicMessages())
