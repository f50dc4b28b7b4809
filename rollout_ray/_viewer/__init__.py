"""The run viewer: ``rollout-ray view`` serves a local web page over run directories.

A JSON API over the stored Parquet shards (a lazily built index of their scalar columns; one
rollout's ``trace`` read on demand) and a static page (``static/``: plain HTML, JS and CSS,
no build step). Imports ``_driver`` (the group finalize), ``_record`` and ``_errors``.
"""
