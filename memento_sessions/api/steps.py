"""The steps a declaration may name, each bound to the services at start, and the composed bridge.handoff.

A step takes the handler it runs around and returns the handler with it: `visit(parts, inner)`. The steps
themselves live with what they do (coordination/steps.py, usage/methods.py); here they only take their
service from `Parts`.
"""

from __future__ import annotations

from typing import Any

from memento_sessions.api.spec import Parts
from memento_sessions.bridge import methods as bridge
from memento_sessions.coordination import steps
from memento_sessions.rpc import Call, Handler, Result
from memento_sessions.usage.methods import folded


def activity(parts: Parts, inner: Handler) -> Handler:
    """Around every method: the caller noted active and known to the mailbox."""
    return steps.activity(parts.coord, inner)


def presence_enter(parts: Parts, inner: Handler) -> Handler:
    return steps.presence_enter(parts.coord, inner)


def presence_exit(parts: Parts, inner: Handler) -> Handler:
    return steps.presence_exit(parts.coord, inner)


def outcome(parts: Parts, inner: Handler) -> Handler:
    """event.emit and .emitBatch: a stored break or fix told to the agents leasing what the session changed."""
    return steps.outcome(parts.coord, inner)


def note_commits(parts: Parts, inner: Handler) -> Handler:
    """event.emit and .emitBatch: each stored `commit` event noted in the commit index (bridge.commit)."""
    return bridge.note_commits(parts.bridge.commits, inner)


def visit(parts: Parts, inner: Handler) -> Handler:
    return steps.visit(parts.coord, inner)


def fenced_emit(parts: Parts, inner: Handler) -> Handler:
    return steps.fenced_emit(parts.coord, inner)


def fenced_batch(parts: Parts, inner: Handler) -> Handler:
    return steps.fenced_batch(parts.coord, inner)


def graph_write(parts: Parts, inner: Handler) -> Handler:
    return steps.graph_write(parts.coord, inner)


def usage_fold(parts: Parts, inner: Handler) -> Handler:
    """event.emit: what the stored event says about usage folded after the write (usage/methods.py)."""
    return folded(parts.usage.store, inner, batch=False)


def usage_fold_batch(parts: Parts, inner: Handler) -> Handler:
    return folded(parts.usage.store, inner, batch=True)


def handoff(parts: Parts) -> Handler:
    """bridge.handoff: the bridge's handoff with the session's live leases and open conflicts (coordination)."""
    async def handler(call: Call, params: Any) -> Result:
        result = await parts.bridge.handoff(call, params)
        result.update(await parts.coord.handoff_leases(call.identity.namespace, result))
        return result
    return handler
