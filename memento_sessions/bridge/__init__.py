"""SessionBridge: transitions, isolate, handoff and outcomes, from Redis events and the knowledge graph.

bridge.py (SessionBridge: the questions agents ask about a session), methods.py (bridge.transitions,
.isolate, .handoff, .outcomes, .commit), timeline.py (what a session's events say, without I/O),
queries.py (every Cypher statement, parameterised), context.py (the KG context of breakage windows),
cache.py (each live session's breakages, kept between calls), archive.py (a session read from its live
keys or, once they expired, its anchors and snapshots), advice.py (a handoff's joining advice),
freshness.py (how fresh a handoff is against the receiver's git state), commits.py (which session
produced a commit).

May import the shared ground, sessions/, history/, lifecycle/, kg/, checkpoints/ (failure snapshots) and
coordination/; not api/, the transports (ws/, mcp/) nor server/.
"""

from memento_sessions.bridge.bridge import SessionBridge

__all__ = ["SessionBridge"]
