"""SessionBridge: transitions, isolate, handoff and outcomes, from Redis events and the knowledge graph.

May import the shared ground, sessions/, kg/ and checkpoints/ (failure snapshots); not the transports
(ws/, mcp/) nor server/.
"""

from memento_sessions.bridge.bridge import SessionBridge

__all__ = ["SessionBridge"]
