"""Event sourcing over a live session: time travel, diff, snapshots and compaction.

views.py (`History`: a session's view at a seq, the diff between two seqs, snapshots taken and kept,
compaction of old events into a snapshot; each folded by the session's one reducer, sessions/condense.py).
Its JSON-RPC methods (session.diff, .snapshot, .compact) are bound in lifecycle/methods.py, beside the
stored sessions' variants of the same reads.

May import the shared ground (the package root), redisio/, usage/ and sessions/; nothing above.
"""
