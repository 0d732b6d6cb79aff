"""Large leases in bounded Function calls (coordination/parts.py): a grant, renew, release or reap of a lease of
4,096 entities is many calls of at most MEMENTO_LEASE_CALL_ENTITIES entities each, and the grant keeps its
promises: all or nothing, never shown before it is granted, nothing left by a crash between its parts, one
winner among agents racing for overlapping sets."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from memento_sessions import keys
from memento_sessions.auth import Identity
from memento_sessions.backends import Backends
from memento_sessions.coordination.leases import Leases
from memento_sessions.coordination.store import CoordStore
from memento_sessions.endpoints import Endpoints
from memento_sessions.errors import Conflict, NotFound
from tests.helpers import command_calls, make_settings

pytestmark = pytest.mark.anyio
ENTITIES = [f"e{i:04d}" for i in range(4096)]  # sorted as numbered: e4000 is in the last part


class CountingStore(CoordStore):
    """The daemon's CoordStore, counting the Function calls it makes and the ARGVs of the largest."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: Counter[str] = Counter()
        self.widest = 0

    async def call(self, function: str, keys: Sequence[str], *args: str | int) -> Any:
        self.calls[function] += 1
        self.widest = max(self.widest, len(args))
        return await super().call(function, keys, *args)


@asynccontextmanager
async def direct(backends: Backends, urls: Endpoints, tmp_path: Path, **overrides: Any) -> AsyncIterator[Leases]:
    """Leases over the Functions, no daemon around them (no reaper unless a test runs one)."""
    store = CountingStore(backends.redis)
    await store.load()
    yield Leases(store, None, make_settings(urls, tmp_path, lease_pace=0, **overrides))


def who(agent: str, namespace: str) -> Identity:
    return Identity(agent, namespace, frozenset({"sessions:write"}))


def counting(leases: Leases) -> CountingStore:
    assert isinstance(leases.store, CountingStore)
    return leases.store


async def nothing_held(backends: Backends, namespace: str) -> None:
    """No lease, hold, count, part or pending grant is left in the namespace."""
    lkeys = keys.lease_keys(namespace)
    assert await backends.redis.exists(lkeys.leases, lkeys.covered, lkeys.counts, lkeys.xcounts,
                                       f"{lkeys.holds}:pending") == 0
    probes = [lkeys.hold(mode, entity) for entity in ENTITIES[::97] for mode in ("exclusive", "shared")]
    assert await backends.redis.exists(*probes) == 0


async def test_a_4096_entity_acquire_renew_and_release_go_in_bounded_calls(
        backends: Backends, backend_urls: Endpoints, tmp_path: Path, namespace: str) -> None:
    """One mc_acquire of 4,096 entities held Redis's one thread 20 to 40 ms (about 5 us an entity); now no call
    names more than MEMENTO_LEASE_CALL_ENTITIES (256) entities: 16 parts, their fences, one commit."""
    async with direct(backends, backend_urls, tmp_path) as leases:
        store, a = counting(leases), who("a", namespace)
        before = await command_calls(backends, "fcall")
        lease = await leases.acquire(a, ENTITIES, 60, "exclusive")
        assert lease["granted"] is True
        assert await command_calls(backends, "fcall") - before == sum(store.calls.values())
        assert store.calls == {"mc_place": 16, "mc_fence": 16, "mc_commit": 1}
        assert store.widest <= 13 + 2 * 256  # mc_place's 13 ARGVs, then its part's 256 (entity, via) pairs
        assert (await leases.listed(namespace, agent_id="a"))["leases"][0]["fencingToken"] == lease["fencingToken"]
        assert await leases.fences(namespace, [ENTITIES[0], ENTITIES[-1]]) == [
            (ENTITIES[0], lease["fencingToken"]), (ENTITIES[-1], lease["fencingToken"])]
        refused = await leases.acquire(who("b", namespace), ENTITIES[4000:4001], 60, "exclusive")
        assert refused["granted"] is False and refused["conflicts"][0]["heldBy"] == "a"

        store.calls.clear()
        renewed = await leases.renew(a, lease["leaseId"], 600)
        assert store.calls == {"mc_renew": 17}  # how many parts, then each, the lease's own end last
        ends = {await backends.redis.zscore(keys.lease_keys(namespace).hold("exclusive", e), f"a/{lease['leaseId']}/")
                for e in ENTITIES[::255]}
        assert len(ends) == 1 and renewed["expiresAt"] > lease["expiresAt"]

        store.calls.clear()
        await leases.release(a, lease["leaseId"])
        assert store.calls["mc_release"] == 1 and store.calls["mc_drop"] == 15  # one part a call
        await nothing_held(backends, namespace)
        assert (await leases.acquire(who("b", namespace), ENTITIES, 60, "exclusive"))["granted"] is True


async def test_a_conflict_in_the_last_part_refuses_all_and_leaves_nothing_held(
        backends: Backends, backend_urls: Endpoints, tmp_path: Path, namespace: str) -> None:
    async with direct(backends, backend_urls, tmp_path) as leases:
        b = who("b", namespace)
        theirs = await leases.acquire(b, ["e4000", "e4001"], 60, "exclusive")
        view = (await leases.listed(namespace), await leases.holds(namespace, ENTITIES[3990:4010]))
        refused = await leases.acquire(who("a", namespace), ENTITIES, 60, "exclusive")
        assert refused["granted"] is False and refused["leaseId"] is None
        assert refused["conflicts"] == [{"entityId": e, "heldBy": "b", "leaseId": theirs["leaseId"],
                                         "mode": "exclusive"} for e in ("e4000", "e4001")]
        assert "conflictsTruncated" not in refused
        assert counting(leases).calls["mc_place"] == 16  # the parts after the conflicting one only checked
        assert (await leases.listed(namespace), await leases.holds(namespace, ENTITIES[3990:4010])) == view
        lkeys = keys.lease_keys(namespace)
        assert await backends.redis.hgetall(lkeys.counts) == {"e4000": "1", "e4001": "1"}
        assert await backends.redis.exists(f"{lkeys.holds}:pending", lkeys.hold("exclusive", "e0000")) == 0
        assert await leases.fences(namespace, ["e0000", "e3999"]) == []  # no token recorded for the refusal
        assert (await leases.acquire(who("a", namespace), ENTITIES[:4000], 60, "exclusive"))["granted"] is True


async def test_past_the_reply_cap_a_refusal_counts_its_conflicts_as_one_call_did(
        backends: Backends, backend_urls: Endpoints, tmp_path: Path, namespace: str) -> None:
    async with direct(backends, backend_urls, tmp_path) as leases:
        await leases.acquire(who("b", namespace), ENTITIES[::8], 60, "shared")  # 512, in every part
        refused = await leases.acquire(who("a", namespace), ENTITIES, 60, "exclusive")
        assert refused["granted"] is False and len(refused["conflicts"]) == 256  # MEMENTO_LEASE_REPLY_MAX
        assert refused["conflictsTruncated"] is True and refused["conflictingEntities"] == 512
        shared = await leases.acquire(who("c", namespace), ENTITIES, 60, "shared")  # advisory: granted, told
        assert shared["granted"] is True and shared["conflicts"] == [] and shared["fencingToken"] > 0


CRASHING = """
import json, sys, anyio
from pathlib import Path
from memento_sessions.auth import Identity
from memento_sessions.backends import redis_client
from memento_sessions.coordination.leases import Leases
from memento_sessions.coordination.store import CoordStore
from memento_sessions.endpoints import Endpoints
from tests.helpers import make_settings

async def main() -> None:
    urls, namespace, data = Endpoints(**json.loads(sys.argv[1])), sys.argv[2], Path(sys.argv[3])
    store = CoordStore(redis_client(urls.redis_url))
    await store.load()
    settings = make_settings(urls, data, lease_pace=0, lease_call_entities=8, lease_pending_ttl=1.0)
    entities = [f"e{i:04d}" for i in range(4096)]
    await Leases(store, None, settings).acquire(Identity("a", namespace, frozenset()), entities, 600, "exclusive")
    print("granted", flush=True)

anyio.run(main)
"""


async def parts_placed(backends: Backends, namespace: str) -> int:
    """How many parts the namespace's one pending grant has placed (0 when there is none)."""
    lkeys = keys.lease_keys(namespace)
    pending = await backends.redis.zrange(f"{lkeys.holds}:pending", 0, 0)
    if not pending:
        return 0
    lease_id = pending[0].decode() if isinstance(pending[0], bytes) else pending[0]
    return int(await backends.redis.hget(lkeys.covered, f"{lease_id}#") or 0)


async def test_a_daemon_killed_between_parts_leaves_nothing_held_after_the_pending_deadline(
        backends: Backends, backend_urls: Endpoints, tmp_path: Path, namespace: str) -> None:
    """A process granting 4,096 entities in parts of 8 is SIGKILLed after its 4th part: the parts placed block
    other grants but no one sees them as a lease, and once MEMENTO_LEASE_PENDING_TTL has passed the reaper
    removes every one of them."""
    urls = json.dumps({"redis_url": backend_urls.redis_url, "postgres_dsn": backend_urls.postgres_dsn,
                       "falkordb_url": backend_urls.falkordb_url})
    child = subprocess.Popen([sys.executable, "-c", CRASHING, urls, namespace, str(tmp_path / "child")],
                             cwd=Path(__file__).parent.parent, stdout=subprocess.PIPE, env=os.environ.copy())
    try:
        with anyio.fail_after(60):
            while (placed := await parts_placed(backends, namespace)) < 4:
                assert child.poll() is None, "the grant ended before it could be killed"
                await anyio.sleep(0.002)
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        out, _ = child.communicate()
    assert 4 <= placed < 512 and child.returncode == -signal.SIGKILL and b"granted" not in out
    killed_at = time.monotonic()
    assert await backends.redis.sismember(keys.coord_namespaces(), namespace)  # indexed before its first write
    async with direct(backends, backend_urls, tmp_path) as leases:
        b = who("b", namespace)
        blocked = await leases.acquire(b, ["e0000"], 60, "exclusive")
        assert blocked["granted"] is False and blocked["conflicts"][0]["heldBy"] == "a"  # held, pending
        assert (await leases.listed(namespace))["leases"] == []  # but no one sees a lease
        assert await leases.holds(namespace, ENTITIES[:32]) == []
        await anyio.sleep(max(0.0, 1.2 - (time.monotonic() - killed_at)))
        await leases.reap_once()
        await nothing_held(backends, namespace)
        assert (await leases.acquire(b, ENTITIES, 60, "exclusive"))["granted"] is True


async def take(leases: Leases, agent: Identity, entities: list[str], got: dict[Identity, dict[str, Any]]) -> None:
    got[agent] = await leases.acquire(agent, entities, 60, "exclusive")


async def test_two_agents_racing_for_overlapping_large_sets_one_wins_and_the_other_then_gets_it(
        backends: Backends, backend_urls: Endpoints, tmp_path: Path, namespace: str) -> None:
    """Parts go in entity order, so two grants meet first on the lowest entity they share: whoever placed it
    wins, the other is refused and holds nothing. Five rounds, the loser then retries and is granted."""
    async with direct(backends, backend_urls, tmp_path) as leases:
        for round_ in range(5):
            a, b = who(f"a{round_}", namespace), who(f"b{round_}", namespace)
            sets = {a: ENTITIES[:3000], b: ENTITIES[1000:]}  # 2,000 shared in the middle
            got: dict[Identity, dict[str, Any]] = {}
            async with anyio.create_task_group() as tg:
                tg.start_soon(take, leases, a, sets[a], got)
                tg.start_soon(take, leases, b, sets[b], got)
            winners = [agent for agent in (a, b) if got[agent]["granted"]]
            assert len(winners) == 1, f"round {round_}: {len(winners)} grants"
            loser = b if winners[0] is a else a
            assert got[loser]["conflicts"] and all(c["heldBy"] == winners[0].agent_id for c in got[loser]["conflicts"])
            held = {hold["heldBy"] for hold in await leases.holds(namespace, ENTITIES[::50])}
            assert held == {winners[0].agent_id}
            await leases.release(winners[0], got[winners[0]]["leaseId"])
            retried = await leases.acquire(loser, sets[loser], 60, "exclusive")
            assert retried["granted"] is True
            await leases.release(loser, retried["leaseId"])
        await nothing_held(backends, namespace)


async def test_a_release_cut_short_ends_the_lease_and_the_reaper_finishes_it(
        backends: Backends, backend_urls: Endpoints, tmp_path: Path, namespace: str) -> None:
    async with direct(backends, backend_urls, tmp_path) as leases:
        a, lkeys = who("a", namespace), keys.lease_keys(namespace)
        lease = await leases.acquire(a, ENTITIES, 60, "shared")
        used, done = await leases.store.call("mc_release", lkeys.all(), int(time.time() * 1000), "a",
                                             lease["leaseId"], 256)  # the first call only: the daemon then dies
        assert int(used) == 256 and int(done) == 0
        assert (await leases.listed(namespace))["leases"] == []  # ended at once
        with pytest.raises(NotFound):
            await leases.renew(a, lease["leaseId"], 60)
        assert await backends.redis.hlen(lkeys.counts) == 4096 - 2 * 256  # the refused renew took one more part
        await leases.reap_once()
        await nothing_held(backends, namespace)
        with pytest.raises(NotFound):
            await leases.release(a, lease["leaseId"])  # run again: already gone


async def test_an_entity_at_its_holds_cap_in_the_last_part_refuses_the_grant_and_leaves_nothing(
        backends: Backends, backend_urls: Endpoints, tmp_path: Path, namespace: str) -> None:
    async with direct(backends, backend_urls, tmp_path, lease_max_holds=1) as leases:
        await leases.acquire(who("b", namespace), ["e4000"], 60, "shared")
        with pytest.raises(Conflict) as refused:
            await leases.acquire(who("a", namespace), ENTITIES, 60, "shared")
        assert refused.value.data["reason"] == "entity_holds" and "e4000" in refused.value.message
        assert await backends.redis.hgetall(keys.lease_keys(namespace).counts) == {"e4000": "1"}
        assert [lease["agentId"] for lease in (await leases.listed(namespace))["leases"]] == ["b"]


async def test_a_daemon_of_the_version_before_parts_still_renews_and_releases_a_lease_whole(
        backends: Backends, backend_urls: Endpoints, tmp_path: Path, namespace: str) -> None:
    """During a rolling upgrade the library is the newest one loaded: the calls of a daemon that knows no parts
    (no part, no budget) get the replies they expect and act on every part."""
    async with direct(backends, backend_urls, tmp_path) as leases:
        lkeys, now = keys.lease_keys(namespace), int(time.time() * 1000)
        lease = await leases.acquire(who("a", namespace), ENTITIES, 60, "exclusive")
        expires, moved = await leases.store.call("mc_renew", lkeys.all(), now, "a", lease["leaseId"], 600_000)
        assert int(expires) == now + 600_000 and int(moved) == 4096
        assert {await backends.redis.zscore(lkeys.hold("exclusive", e), f"a/{lease['leaseId']}/")
                for e in ENTITIES[::255]} == {now + 600_000}
        assert await leases.store.call("mc_release", lkeys.all(), now, "a", lease["leaseId"]) == 4097
        await nothing_held(backends, namespace)
