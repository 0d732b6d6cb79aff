"""Raw Redis I/O on the hot path: the connections the daemon opens itself, below redis-py.

resp.py (RESP encoding, Redis URLs, raw connections), pipe.py (the auto-pipelined connection every
Function call goes over), cluster.py (one such connection per primary of a Redis Cluster, by slot),
pubsub.py (the daemon's one pub/sub connection), fanout.py (routes its messages to local listeners by
channel), shards.py (a Redis Cluster's sharded pub/sub: one SSUBSCRIBE connection per primary).
Every reconnect here pauses as the package's one backoff policy says (retry.py).

Knows Redis, not sessions: it may import only the shared ground (the package root).
"""
