"""A taskset with no tasks."""

from rollout_ray import ChatHarness


def tasks():
    return []


def harness():
    return ChatHarness()
