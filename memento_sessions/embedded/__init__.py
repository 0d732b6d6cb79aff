"""Embedded backends: a FalkorDB-enabled redis-server and a Postgres, run as supervised children.

A leaf beside redisio/: it may import only the shared ground (the package root).
"""
