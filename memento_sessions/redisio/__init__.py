"""Raw Redis I/O on the hot path: the connections the daemon opens itself, below redis-py.

resp.py (RESP encoding, Redis URLs, raw connections), pipe.py (the auto-pipelined connection every
Function call goes over), pubsub.py (the daemon's one pub/sub connection), fanout.py (routes its
messages to local listeners by channel).

Knows Redis, not sessions: it may import only the shared ground (the package root).
"""
