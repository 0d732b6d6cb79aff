"""Event sourcing over a live session: time travel, diff, snapshots and compaction.

views.py (`History`: a session's view at a seq, the diff between two seqs, snapshots taken and kept,
compaction of old events into a snapshot; each folded by the session's one reducer, sessions/condense.py),
methods.py (its JSON-RPC methods: session.diff, .snapshot, .compact). The `History` is built by the
lifecycle (lifecycle/methods.py), whose reads of a stored session fold through it too.

May import the shared ground (the package root), redisio/, usage/ and sessions/; nothing above.
"""
