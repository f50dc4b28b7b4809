"""Harnesses: agent programs. ``ChatHarness`` (an in-process tool-calling loop over HTTP)
and ``ProgramHarness`` (a program run in the rollout's runtime). Imports ``_core``,
``_record`` and ``_errors``.
"""
