"""The record: the Trace and everything it is made of, on the wire and on disk.

Messages, the Trace and its conversation graph, the OpenAI Chat Completions wire codec, the
Arrow schema and the run store (Parquet shards and a manifest). Plain data and files: no
event loop, no network, no Ray. Imports only ``_errors``.
"""
