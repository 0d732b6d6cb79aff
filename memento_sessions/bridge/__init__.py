"""SessionBridge: transitions, isolate, handoff and outcomes, from Redis events and the knowledge graph."""

from memento_sessions.bridge.bridge import SessionBridge

__all__ = ["SessionBridge"]
