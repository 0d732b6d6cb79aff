"""Embedded backends: a FalkorDB-enabled redis-server and a Postgres, run as supervised children."""
