"""The driver: tasks × samples rollouts, bounded in flight, into Arrow tables and
finalized groups; the local executor; the group finalize. Never imports ``ray``: a Ray
executor is handed in. Imports ``_serving``, ``_runtimes``, ``_core``, ``_record`` and
``_errors``.
"""
