"""A taskset whose tasks() yields plain dicts instead of Tasks (a common first mistake)."""

from rollout_ray import ChatHarness


def tasks():
    return [{"prompt": "What is 1 + 1?"}]


def harness():
    return ChatHarness()
