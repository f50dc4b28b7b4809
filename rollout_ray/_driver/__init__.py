"""The driver: tasks × samples rollouts, bounded in flight, into Arrow tables and
finalized groups; the group finalize. Never imports ``ray``: an executor is handed in.
Imports ``_hosting``, ``_serving``, ``_runtimes``, ``_core``, ``_record`` and ``_errors``.
"""
