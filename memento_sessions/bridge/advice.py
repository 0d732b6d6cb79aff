"""The joining advice of a handoff: two or three sentences a joining agent can act on."""

from __future__ import annotations

from collections.abc import Sequence

from memento_sessions.bridge.archive import Record
from memento_sessions.bridge.timeline import Event, entity_ids, last_break

SHOWN = 3


def joining(record: Record, recent: Sequence[Event], ids: Sequence[str]) -> str:
    """E.g. "Broken at seq 7 by bob (fn:a): fix it before new work. Sync with agents: al, bob. ..."."""
    parts = [_state(record, recent), f"Sync with agents: {', '.join(record.session['agentIds']) or 'none'}."]
    if ids:
        parts.append(f"Recent changes touched {_names(ids)}.")
    return " ".join(parts)


def _state(record: Record, recent: Sequence[Event]) -> str:
    session = record.session
    if record.source == "archive":
        kept = f" and a failure snapshot of {len(record.events)} events" if record.snapshot else ""
        anchors = len(record.anchors or [])
        return (f"Session expired; rebuilt from {anchors} anchor{'' if anchors == 1 else 's'}{kept}, "
                f"last outcome {session['state']}: start a new session to continue.")
    broke = last_break(recent) if session["state"] == "broken" else None
    if broke is not None:
        where = f" ({_names(entity_ids(broke))})" if entity_ids(broke) else ""
        return f"Broken at seq {broke['seq']} by {broke.get('actor')}{where}: fix it before new work."
    return f"Session {session['state']} at seq {session['seq']}."


def _names(ids: Sequence[str]) -> str:
    shown = ", ".join(ids[:SHOWN])
    return shown + (f" and {len(ids) - SHOWN} more" if len(ids) > SHOWN else "")
