"""The built-in simulated model: a deterministic OpenAI-compatible server (the embedded
default of ``rollout-ray eval``). Standalone: imports nothing of the package but ``_errors``.

``config`` (the one config), ``policy`` (what it answers), ``tokenizer`` and ``template``
(text ↔ ids, messages → prompt ids), ``logprobs``, ``request`` (a checked request and its
dialect), ``completion`` (one choice: answer, ids, log-probabilities, draws), ``dialects``
(vLLM and SGLang token-capture shapes), ``server`` (HTTP, faults, latency, policy version).
"""
