"""The session lifecycle: sessions moved between Redis and Postgres, forked, and read where they are stored.

moves.py (suspend: Redis -> Postgres; resume: back, same seqs; clear; each step leaves a mark saying which
copy is authoritative after a crash), fork.py (`session.fork`), streams.py (a whole session read from or
written to Redis a chunk at a time), postgres.py (the `suspended_sessions` table and its chunks),
reads.py (`session.get` and friends answered from a stored row), methods.py (the JSON-RPC methods of the
lifecycle and event sourcing, and the background work: suspending idle sessions, archiving old ones).

May import the shared ground (the package root), redisio/, usage/, sessions/ and history/; nothing above.
"""
