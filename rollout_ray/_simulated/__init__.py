"""The built-in simulated model: a deterministic OpenAI-compatible server (the embedded
default of ``rollout-ray eval``). Standalone: imports nothing of the package but ``_errors``.

``config`` (the one config), ``policy`` (what it answers), ``tokenizer`` and ``template``
(text ↔ ids, messages ↔ prompt ids), ``logprobs``, ``request`` (a checked request and its
dialect), ``request_draws`` (each request's draws), ``completion`` (one choice: answer, ids,
log-probabilities, draws, per policy version), ``engine_state`` (policy version over time, pause,
generations in flight), ``decoding`` (token by token on the engine's clock, continuing a
completion), ``dialects`` and ``plain`` (the chat shapes with and without token capture),
``generate`` (the token-in routes), ``weight_routes`` (abort, pause, weights), ``sse``, ``model_server``
(HTTP, faults, latency); the opt-in capacity model: ``kv_cache`` (blocks, prefix cache),
``scheduler`` (batch steps, waiting queue, preemption), ``batcher`` (on the clock, ``/metrics``).
"""
