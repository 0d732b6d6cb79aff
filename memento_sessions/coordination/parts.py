"""Large leases in bounded Function calls: a grant, renew or release of a lease covering more entities than
MEMENTO_LEASE_CALL_ENTITIES goes in parts, one call each, so no lease write holds Redis's one thread for
long (about 5 us an entity: one call of 4,096 entities held it 20 to 40 ms, and every other client with it).

A grant in parts keeps the promises of a grant in one call (coordination.lua, "pending"):

- the entities go in one order (sorted), a part at a time; each part is checked as a whole grant is and its
  holds placed, marked pending: they conflict for other agents' grants at once, but no list, hold read or
  conflict alert shows them, and the lease cannot be renewed or released;
- an exclusive part that meets a conflict places nothing; what the parts before it placed is dropped and the
  rest are only checked, so the caller gets the conflicts it would have got from one call, and nothing held;
  two grants racing for overlapping sets meet first on the lowest entity they share, so one of them wins;
- an exclusive lease's token is taken by its first part and recorded on its entities after every part is
  placed (never lowering a newer one), then one small call grants it. A grant that fails or is cancelled
  between parts is dropped by its caller, and one whose daemon died by any daemon's reaper once its pending
  deadline (MEMENTO_LEASE_PENDING_TTL) has passed.

A release marks the lease ended in its first call, then removes its parts; a renew moves the holds of its
last parts first and the lease's own end last. Cut short, either leaves a lease that ends as stored and that
the reaper removes; both are safe to run again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio
import pydantic_core

from memento_sessions import keys
from memento_sessions.auth import Identity
from memento_sessions.coordination.coverage import Pairs
from memento_sessions.coordination.store import CoordStore
from memento_sessions.errors import BackendUnavailable
from memento_sessions.logs import get_logger
from memento_sessions.sessions.manager import now_ms
from memento_sessions.settings import Settings

log = get_logger(__name__)
Result = dict[str, Any]
Part = tuple[Pairs, Pairs]  # (entity, via) pairs held, and (container, entity) pairs checked


def split(pairs: Pairs, above: Pairs, size: int) -> list[Part]:
    """The pairs in entity order (each entity once, its first via), in parts of at most `size` pairs and checked
    containers together, each entity's containers in its part."""
    first: dict[str, str] = {}
    for entity, via in pairs:
        first.setdefault(entity, via)
    containers: dict[str, Pairs] = {}
    for outer, entity in above:
        containers.setdefault(entity, []).append((outer, entity))
    parts: list[Part] = []
    held: Pairs = []
    checked: Pairs = []
    for entity in sorted(first):
        mine = containers.get(entity, [])
        if held and len(held) + len(checked) + 1 + len(mine) > size:
            parts.append((held, checked))
            held, checked = [], []
        held.append((entity, first[entity]))
        checked += mine
    return [*parts, (held, checked)]


def covers_of(pairs: Pairs, room: int) -> tuple[str, int]:
    """The JSON array of the first `room` entities held through the graph, and how many more there are."""
    covers = [entity for entity, via in pairs if via]
    return pydantic_core.to_json(covers[:room]).decode(), max(0, len(covers) - room)


class Parts:
    """Grants, renews and releases leases a bounded part per Function call."""

    def __init__(self, store: CoordStore, settings: Settings) -> None:
        self.store = store
        self.settings = settings

    def fits(self, pairs: Pairs, above: Pairs) -> bool:
        """Whether one call may hold and check these pairs (a grant in one call, as mc_acquire)."""
        return len(pairs) + len(above) <= self.settings.lease_call_entities

    async def grant(self, who: Identity, lease_id: str, mode: str, ttl: int, tail: str, version: str,
                    pairs: Pairs, above: Pairs) -> Result:
        """The grant in parts: `{granted, conflicts, ...}` as mc_acquire answers, or `{stale: true}`."""
        parts, start = split(pairs, above, self.settings.lease_call_entities), now_ms()
        plan = (mode, start + ttl * 1000, version, start + int(self.settings.lease_pending_ttl * 1000))
        try:
            placed = await self._place(who, lease_id, plan, parts)
            if placed.get("stale") or not placed["granted"]:
                await self.drop(who, lease_id)
                return placed
            if mode == "exclusive":
                for number in range(1, len(parts) + 1):
                    await self.store.call("mc_fence", self._keys(who), lease_id, number)
            covers, omitted = covers_of(pairs, self.settings.lease_reply_max)
            raw = await self.store.call("mc_commit", self._keys(who), now_ms(), who.agent_id, lease_id, tail,
                                        covers, omitted, plan[1])
            granted: Result = dict(pydantic_core.from_json(raw))
            if granted.get("gone"):
                raise gone(lease_id)
        except BaseException:
            with anyio.CancelScope(shield=True):  # a grant given up is dropped now, not at its deadline
                await self._drop_quietly(who, lease_id)
            raise
        return {**placed, **granted}

    async def _place(self, who: Identity, lease_id: str, plan: tuple[str, int, str, int], parts: list[Part]) -> Result:
        """Each part checked and placed in turn; past an exclusive part's conflict, the rest only checked."""
        mode, expires, version, deadline = plan
        conflicts: list[Result] = []
        conflicting, cut, placing = 0, False, True
        for number, (held, checked) in enumerate(parts, 1):
            flat = flat_pairs(held)
            room = max(0, self.settings.lease_reply_max - len(conflicts))
            raw = await self.store.call(
                "mc_place", self._keys(who), now_ms(), who.agent_id, lease_id, mode, expires, self.settings.lease_max,
                version, self.settings.lease_max_holds, room, deadline, number, int(placing), len(flat), *flat,
                *flat_pairs(checked))
            part: Result = dict(pydantic_core.from_json(raw))
            if part.get("stale"):
                return {"granted": False, "stale": True}
            if part.get("gone"):
                raise gone(lease_id)
            conflicts += part["conflicts"] if isinstance(part["conflicts"], list) else []
            conflicting, cut = conflicting + int(part["conflictingEntities"]), cut or bool(part["cut"])
            if placing and not part.get("placed"):
                placing = False
                await self.drop(who, lease_id)  # free what the parts before it hold before checking the rest
        reply: Result = {"granted": placing, "conflicts": conflicts}
        if cut:
            reply |= {"conflictsTruncated": True, "conflictingEntities": conflicting}
        return reply

    async def drop(self, who: Identity, lease_id: str) -> int:
        """Remove the agent's lease a part per call, until it is gone; the holds removed."""
        spent, done = 0, False
        while not done:
            used, finished = await self.store.call("mc_drop", self._keys(who), now_ms(), who.agent_id, lease_id,
                                                   self.settings.lease_call_entities)
            spent, done = spent + int(used), bool(int(finished))
        return spent

    async def _drop_quietly(self, who: Identity, lease_id: str) -> None:
        try:
            await self.drop(who, lease_id)
        except Exception as exc:  # Redis away: the reaper drops it once its pending deadline has passed
            log.warning("a lease grant in parts was left to the reaper", lease_id=lease_id, error=repr(exc))

    async def release(self, who: Identity, lease_id: str) -> int:
        """End the lease now and remove its holds a part per call; the holds removed."""
        used, done = await self.store.call("mc_release", self._keys(who), now_ms(), who.agent_id, lease_id,
                                           self.settings.lease_call_entities)
        return int(used) + (0 if int(done) else await self.drop(who, lease_id))

    async def renew(self, who: Identity, lease_id: str, ttl: int) -> tuple[int, int]:
        """Move the lease's end to now + ttl, its last parts first; (the new end in ms, the holds moved)."""
        now, lkeys = now_ms(), self._keys(who)
        expires, moved, parts = await self.store.call("mc_renew", lkeys, now, who.agent_id, lease_id, ttl * 1000, 0)
        total = int(moved)
        for number in range(int(parts), 0, -1) if int(parts) > 1 else ():  # part 1, with the lease's end, last
            expires, moved, _ = await self.store.call("mc_renew", lkeys, now, who.agent_id, lease_id, ttl * 1000,
                                                      number)
            total += int(moved)
        return int(expires), total

    @staticmethod
    def _keys(who: Identity) -> list[str]:
        return keys.lease_keys(who.namespace).all()


def gone(lease_id: str) -> BackendUnavailable:
    """A grant in parts whose pending lease was dropped (it outlived MEMENTO_LEASE_PENDING_TTL): try again."""
    return BackendUnavailable(f"redis: lease {lease_id} was dropped before all its parts were placed "
                              "(MEMENTO_LEASE_PENDING_TTL passed); try again")


def flat_pairs(pairs: Sequence[tuple[str, str]]) -> list[str]:
    """(a, b) pairs as one flat list, as the Functions take them."""
    return [item for pair in pairs for item in pair]
