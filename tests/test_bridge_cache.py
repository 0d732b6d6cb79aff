"""The bridge's breakage cache: cached answers equal uncached ones, new events and re-creation are seen,
the bound holds, and folding in chunks with the graph asked as windows appear gives the one-batch answer."""

from __future__ import annotations

import gc
import json
import random
from typing import Any

import pytest
from prometheus_client import REGISTRY

from memento_sessions.auth import Identity
from memento_sessions.backends import Backends
from memento_sessions.bridge import cache, context
from memento_sessions.bridge.bridge import SessionBridge
from memento_sessions.errors import NotFound
from memento_sessions.kg.fixture import generate
from memento_sessions.kg.graph import Graphs
from memento_sessions.kg.loader import parse_lines, upsert
from memento_sessions.sessions.manager import SessionManager
from memento_sessions.sessions.models import EventIn
from memento_sessions.settings import Settings

pytestmark = pytest.mark.anyio


def who(namespace: str, agent: str = "alice") -> Identity:
    return Identity(agent, namespace, frozenset({"sessions:read", "sessions:write"}))


def random_events(rng: random.Random, count: int) -> list[EventIn]:
    """Edits on a few entities with breaks and fixes mixed in."""
    kinds = ["modified"] * 6 + ["broke", "test_pass", "start"]
    return [EventIn.model_validate({"type": rng.choice(kinds), "changeInfo": {"entityIds": rng.sample(
        ["fn:a", "fn:b", "fn:c", "fn:d", "fn:e", "fn:f", "fn:g"], 2)}, "impact": {"perfDelta": rng.randint(-3, 3)}})
        for _ in range(count)]


async def answers(bridge: SessionBridge, namespace: str, sid: str) -> list[Any]:
    return [await bridge.transitions(namespace, sid), await bridge.transitions(namespace, sid, "fn:c"),
            await bridge.isolate(namespace, sid, "alice"), await bridge.isolate(namespace, sid, "bob")]


async def test_cached_answers_equal_uncached_ones_as_events_arrive(settings: Settings, backends: Backends,
                                                                   namespace: str) -> None:
    manager = SessionManager(backends.redis, settings)
    await manager.start()
    cached, uncached = SessionBridge(manager, backends, 10_000), SessionBridge(manager, backends, 0)
    sid = (await manager.create(who(namespace)))["sessionId"]
    rng = random.Random(5)
    for round_ in range(12):
        for event in random_events(rng, rng.randint(0, 25)):
            await manager.emit(who(namespace, rng.choice(["alice", "bob"])), sid, event)
        assert await answers(cached, namespace, sid) == await answers(uncached, namespace, sid), round_
    transitions = (await cached.transitions(namespace, sid))["transitions"]
    assert len(transitions) >= 5  # the random session did break, so the comparison compared something
    assert cached.cache.size == len(transitions) + 1  # the breaking events held, plus one for the entry
    assert uncached.cache.size == 0
    (entry, _, _), = cached.cache._entries.values()
    # Held as text, breakages are no container objects: they neither count toward a young collection nor
    # get walked by one.
    assert all(isinstance(b, str) and not gc.is_tracked(b) for b in entry.fold.found)


async def test_a_session_recreated_under_its_id_is_read_afresh(settings: Settings, backends: Backends,
                                                               namespace: str) -> None:
    manager = SessionManager(backends.redis, settings)
    await manager.start()
    bridge = SessionBridge(manager, backends, 10_000)
    sid = (await manager.create(who(namespace), session_id="reused"))["sessionId"]
    for kind in ("modified", "broke", "modified", "broke"):
        await manager.emit(who(namespace), sid, EventIn(type=kind))
    assert [t["toSeq"] for t in (await bridge.transitions(namespace, sid))["transitions"]] == [2]
    await backends.redis.delete(*[f"ms:{namespace}:{{reused}}:{part}" for part in ("session", "events", "agents")])
    with pytest.raises(NotFound):
        await bridge.cache.read(manager, namespace, sid)
    assert bridge.cache.size == 0
    await manager.create(who(namespace), session_id="reused")
    for kind in ("modified", "modified", "modified", "broke", "test_pass"):
        await manager.emit(who(namespace), sid, EventIn(type=kind))
    result = await bridge.transitions(namespace, sid)
    assert [(t["fromSeq"], t["toSeq"]) for t in result["transitions"]] == [(0, 4)]
    assert (await bridge.isolate(namespace, sid, "alice"))["events"][-1]["seq"] == 5


async def test_the_cache_holds_at_most_its_limit_of_events(settings: Settings, backends: Backends,
                                                           namespace: str) -> None:
    manager = SessionManager(backends.redis, settings)
    await manager.start()
    bridge = SessionBridge(manager, backends, 25)
    flapping = [EventIn(type=kind) for kind in ("broke", "test_pass") * 10]  # 10 breakages: 11 held
    for _ in range(4):
        sid = (await manager.create(who(namespace)))["sessionId"]
        await manager.emit_batch(who(namespace), sid, flapping)
        assert len((await bridge.transitions(namespace, sid))["transitions"]) == 10
        assert bridge.cache.size <= 25
    assert bridge.cache.size == 22  # the two most recently read sessions
    big = (await manager.create(who(namespace)))["sessionId"]
    await manager.emit_batch(who(namespace), big, flapping * 3)
    assert len((await bridge.transitions(namespace, big))["transitions"]) == 30  # answered, not kept
    assert bridge.cache.size == 22


def wide_break(i: int) -> EventIn:
    """A breaking event whose changeInfo names 40 long entity ids (~8 KiB kept by its breakage)."""
    ids = [f"src/module_{i}/{'x' * 180}::fn_{k}" for k in range(40)]
    return EventIn.model_validate({"type": "broke", "changeInfo": {"entityIds": ids}})


async def test_the_cache_holds_at_most_its_limit_of_bytes(settings: Settings, backends: Backends,
                                                          namespace: str) -> None:
    manager = SessionManager(backends.redis, settings)
    await manager.start()
    bridge = SessionBridge(manager, backends, 0)
    bridge.cache = cache.EventCache(10**6, max_bytes=300_000)  # the event count alone would hold them all
    evicted = REGISTRY.get_sample_value("memento_bridge_cache_evictions_total") or 0.0
    sids = []
    for n in range(4):
        sid = (await manager.create(who(namespace)))["sessionId"]
        sids.append(sid)
        events = [wide_break(n * 100 + i) if i % 2 == 0 else EventIn(type="test_pass") for i in range(30)]
        await manager.emit_batch(who(namespace), sid, events)  # 15 breakages of ~8 KiB: ~125 KB an entry
        assert len((await bridge.transitions(namespace, sid))["transitions"]) == 15
        assert bridge.cache.nbytes <= 300_000
    held = list(bridge.cache._entries.items())
    assert [key[1] for key, _ in held] == sids[2:]  # the two most recently read sessions
    for key, (entry, _, counted) in held:
        real = sum(len(item) for item in entry.fold.found)
        assert 15 * 8000 < real < counted == entry.nbytes(key) < real + 2_000  # sized by what it holds
    assert bridge.cache.nbytes == sum(counted for _, (_, _, counted) in held)
    assert REGISTRY.get_sample_value("memento_bridge_cache_evictions_total") == evicted + 2
    assert REGISTRY.get_sample_value("memento_bridge_cache_bytes") == bridge.cache.nbytes
    bridge.cache = cache.EventCache(10**6, max_bytes=100_000)  # one entry is over the whole bound
    assert len((await bridge.transitions(namespace, sids[0]))["transitions"]) == 15  # answered, not kept
    assert (bridge.cache.nbytes, bridge.cache.size, len(bridge.cache._entries)) == (0, 0, 0)


async def test_the_cache_holds_at_most_limit_sessions_and_a_small_window_each(settings: Settings,
                                                                             backends: Backends,
                                                                             namespace: str) -> None:
    manager = SessionManager(backends.redis, settings)
    await manager.start()
    bridge = SessionBridge(manager, backends, 3)
    for _ in range(5):  # sessions that never break: one counted event each
        sid = (await manager.create(who(namespace)))["sessionId"]
        await manager.emit_batch(who(namespace), sid, [EventIn.model_validate(
            {"type": "modified", "changeInfo": {"entityIds": [f"fn:{i}:{k}" for k in range(50)]}})
            for i in range(40)])  # 2,000 distinct entities changed since the session last worked
        assert (await bridge.transitions(namespace, sid))["transitions"] == []
    assert (len(bridge.cache._entries), bridge.cache.size) == (3, 3)
    for entry, _, counted in bridge.cache._entries.values():
        assert list(entry.fold.window) == [f"fn:39:{k}" for k in range(45, 50)]  # only what a breakage reports
        assert counted < 2_000


async def test_compact_graph_replies_read_as_the_falkordb_client_reads_them(backends: Backends, graph: Any,
                                                                           namespace: str) -> None:
    """The bridge reads FalkorDB's compact replies itself; every kind of value its queries return."""
    await graph.query("CREATE (:CodebaseEntity {id: 'x'})")
    query = ("MATCH (e:CodebaseEntity {id: $id}) RETURN null, 'text ü \"q\"', 42, -7, true, false, 2.5, "
             "[1, 'a', [null, e.id]], {k: 1, m: {n: 'v', l: [true]}}, properties(e)")
    ours = await Graphs(backends).rows(namespace, query, {"id": "x"})
    theirs = (await graph.ro_query(query, {"id": "x"})).result_set
    assert ours == theirs == [[None, 'text ü "q"', 42, -7, True, False, 2.5, [1, "a", [None, "x"]],
                               {"k": 1, "m": {"n": "v", "l": [True]}}, {"id": "x"}]]
    assert await Graphs(backends).rows(namespace, "MATCH (n:Nothing) RETURN n.id", {}) == []
    with pytest.raises(ValueError, match="compact type 8"):
        await Graphs(backends).rows(namespace, "MATCH (e:CodebaseEntity) RETURN e", {})


async def test_context_asked_while_folding_gives_the_one_batch_answer(settings: Settings, backends: Backends,
                                                                     namespace: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    nodes, edges = parse_lines(json.dumps(record) for record in generate(200, seed=3))
    await upsert(await Graphs(backends).get(namespace), nodes, edges)
    entities = [node.id for node in nodes if node.labels == ["CodebaseEntity"]][:40]
    manager = SessionManager(backends.redis, settings)
    await manager.start()
    sid = (await manager.create(who(namespace)))["sessionId"]
    rng = random.Random(9)
    kinds = ["modified"] * 5 + ["broke", "test_pass"]
    await manager.emit_batch(who(namespace), sid, [EventIn.model_validate({"type": kinds[i % 7], "changeInfo": {
        "entityIds": rng.sample(entities, 2)}, "impact": {"perfDelta": rng.randint(-3, 3)}}) for i in range(140)])

    async def transitions(chunk: int, split_above: int) -> tuple[Any, int]:
        monkeypatch.setattr(cache, "CHUNK", chunk)
        monkeypatch.setattr(context, "SPLIT_ABOVE", split_above)
        bridge = SessionBridge(manager, backends, 0)
        rows, queries = bridge.graphs.rows, []

        async def counted(*args: Any) -> Any:
            queries.append(args)
            return await rows(*args)

        monkeypatch.setattr(bridge.graphs, "rows", counted)
        return await bridge.transitions(namespace, sid), len(queries)

    whole, one = await transitions(10**9, 10**9)
    streamed, many = await transitions(7, 3)
    assert one == 1 and many > 20, "the whole fold asks once; 7-event chunks ask as their windows appear, split"
    assert streamed == whole
    assert len(whole["transitions"]) == 20 and all("kgContext" in t for t in whole["transitions"])


async def test_a_read_never_creates_a_graph_and_sees_it_deleted_and_made_again(backends: Backends,
                                                                               namespace: str) -> None:
    graphs, name = Graphs(backends), backends.graph_name(namespace)
    ids = "MATCH (n:CodebaseEntity) RETURN n.id"
    assert await graphs.rows(namespace, ids, {}) == []
    assert not await backends.falkordb.connection.exists(name), "a read of a missing graph left it missing"
    graph = await Graphs(backends).get(namespace)
    await graph.query("CREATE (:CodebaseEntity {id: 'a'})")
    assert await graphs.rows(namespace, ids, {}) == [["a"]]
    await graph.delete()
    assert await graphs.rows(namespace, ids, {}) == [], "deleted since it was indexed: nothing, no error"
    assert not await backends.falkordb.connection.exists(name)
    await (await Graphs(backends).get(namespace)).query("CREATE (:CodebaseEntity {id: 'b'})")
    assert await graphs.rows(namespace, ids, {}) == [["b"]]
