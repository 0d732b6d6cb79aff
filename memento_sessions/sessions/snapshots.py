"""The compaction snapshots of one session: the folded state at a seq, kept under the session's hash tag.

They live in the session's ids hash (field `~snap:<seq>`, no client id can start with `~`), so they share
every TTL refresh of the session's keys and travel with it when it is suspended or forked. The Redis
Functions `ms_snapshot` and `ms_snapshot_at` (functions.lua) write and find them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pydantic_core

from memento_sessions.keys import SessionKeys
from memento_sessions.sessions.condense import Condenser
from memento_sessions.sessions.functions import FunctionStore

SNAPSHOT_PREFIX = "~snap:"
SNAPSHOT_LIST = "~snaps"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A stored snapshot: the reducer's state right after event `seq`."""

    seq: int
    data: dict[str, Any]

    def condenser(self) -> Condenser:
        """The reducer in this snapshot's state."""
        return Condenser.load(self.data)

    def wire(self) -> dict[str, Any]:
        """The snapshot as replies carry it: its id, seq and the condensed view at that seq."""
        folder = self.condenser()
        return {"snapshotId": snapshot_id(self.seq), "seq": self.seq, "state": folder.state,
                "agentIds": sorted(folder.actors), **folder.result()}


def snapshot_id(seq: int) -> str:
    """A snapshot's id within its session: one snapshot per seq."""
    return f"snap-{seq}"


async def snapshot_at(store: FunctionStore, skeys: SessionKeys, at_seq: int) -> Snapshot | None:
    """The newest snapshot at or before `at_seq`, if any."""
    seq, data = await store.call("ms_snapshot_at", skeys, at_seq)
    if int(seq) == 0:
        return None
    return Snapshot(int(seq), pydantic_core.from_json(data))


def is_snapshot_field(field: str) -> bool:
    """Whether an ids-hash field is a snapshot (or their list) rather than a client's event id."""
    return field.startswith("~")
