"""The small launchers ``agents.py`` ships into a rollout's work directory (standard library
only): each reads the rollout's prompt and endpoint from the environment ``ProgramHarness``
sets, writes the agent's configuration into the work directory and ``exec``s the agent."""
