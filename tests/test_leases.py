"""Entity leases: graph coverage, all-or-nothing exclusives, fencing, conflict alerts, orphans."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

from memento_sessions import keys
from memento_sessions.auth import Identity
from memento_sessions.backends import Backends
from memento_sessions.coordination import coverage
from memento_sessions.coordination.leases import Leases
from memento_sessions.coordination.store import CoordStore
from memento_sessions.endpoints import Endpoints
from memento_sessions.kg.graph import Graph, Graphs
from memento_sessions.server.daemon import Daemon, running
from memento_sessions.settings import Settings
from tests.helpers import falkordb_url, make_settings, token
from tests.rpcsocket import RpcSocket, rpc

pytestmark = pytest.mark.anyio
FILE, LOGIN = "file:src/auth.py", "sym:src/auth.py:login"


@asynccontextmanager
async def two_daemons(urls: Endpoints, tmp_path: Path, **overrides: Any) -> AsyncIterator[tuple[Daemon, Daemon]]:
    """Two daemons on the same Redis, as behind a load balancer."""
    async with AsyncExitStack() as stack:
        first = await stack.enter_async_context(running(make_settings(urls, tmp_path / "1", **overrides)))
        second = await stack.enter_async_context(running(make_settings(urls, tmp_path / "2", **overrides)))
        yield first, second


async def auth_graph(graph: Graph) -> None:
    await graph.query("CREATE (:CodebaseEntity {id: $file})-[:DEFINES]->(:CodebaseEntity:Symbol {id: $sym})",
                      {"file": FILE, "sym": LOGIN})


async def session(sock: RpcSocket) -> str:
    sid: str = (await sock.call("session.create", {}))["sessionId"]
    return sid


async def test_a_file_lease_covers_its_symbols_and_an_emit_on_one_alerts_the_holder(
        backend_urls: Endpoints, tmp_path: Path, namespace: str, graph: Graph) -> None:
    await auth_graph(graph)
    async with two_daemons(backend_urls, tmp_path) as (d1, d2), rpc(d1.port, token("a", namespace)) as a, \
            rpc(d2.port, token("b", namespace)) as b:
        held = await a.call("lease.acquire", {"entityIds": [FILE], "ttl": 60, "mode": "exclusive"})
        assert held["granted"] is True and held["covers"] == [LOGIN] and held["fencingToken"] >= 1

        refused = await b.call("lease.acquire", {"entityIds": [LOGIN], "ttl": 60, "mode": "exclusive"})
        assert refused == {"leaseId": None, "granted": False, "fencingToken": None, "expiresAt": None,
                           "conflicts": [{"entityId": LOGIN, "heldBy": "a", "leaseId": held["leaseId"],
                                          "mode": "exclusive", "via": FILE}]}
        assert (await b.call("lease.list", {"agentId": "b"}))["leases"] == []  # nothing granted

        sid = await session(b)
        started = time.perf_counter()
        emitted = await b.call("event.emit", {"sessionId": sid, "event": {
            "type": "modified", "changeInfo": {"entityIds": [LOGIN], "operation": "modified"}}})
        alert = await a.notification("lease.conflict", timeout=2)
        assert time.perf_counter() - started < 0.1
        conflict = {"entityId": LOGIN, "heldBy": "a", "leaseId": held["leaseId"], "mode": "exclusive", "via": FILE}
        assert emitted == {"seq": 1, "duplicate": False, "conflicts": [conflict]}
        assert alert["params"]["body"] == {**conflict, "sessionId": sid, "seq": 1, "eventType": "modified", "by": "b"}

        events = (await b.call("session.get", {"sessionId": sid}))["events"]
        assert [e["type"] for e in events] == ["modified", "conflict"]
        assert events[1]["data"] == {"seq": 1, "conflicts": [conflict]}
        inbox = (await a.call("mailbox.read", {}))["messages"]
        assert [(m["subject"], m["body"]["seq"]) for m in inbox] == [("lease.conflict", 1)]


async def test_a_batch_reads_the_holds_once_and_alerts_each_conflicting_event(daemon: Daemon, namespace: str) -> None:
    """emitBatch: conflicts per stored event with its seq, one alert per conflicting lease of a stored event,
    none for a duplicate or an event on free entities (the holds are now read once for the whole batch)."""
    async with rpc(daemon.port, token("a", namespace)) as a, rpc(daemon.port, token("b", namespace)) as b:
        on_e1 = await a.call("lease.acquire", {"entityIds": ["e1"], "ttl": 60, "mode": "exclusive"})
        on_e2 = await a.call("lease.acquire", {"entityIds": ["e2"], "ttl": 60, "mode": "shared"})
        sid = await session(b)
        await b.call("event.emit", {"sessionId": sid, "event": {"id": "old", "type": "modified", "changeInfo": {
            "entityIds": ["e1"], "operation": "modified"}}})  # seq 1, and its conflict record seq 2
        assert (await a.notification("lease.conflict", timeout=2))["params"]["body"]["seq"] == 1

        def edit(event_id: str, *entities: str) -> dict[str, Any]:
            return {"id": event_id, "type": "modified", "changeInfo": {"entityIds": list(entities),
                                                                        "operation": "modified"}}

        reply = await b.call("event.emitBatch", {"sessionId": sid, "events": [
            edit("old", "e1"), edit("n1", "free"), edit("n2", "e2", "free", "e1"), edit("n3", "e1")]})
        one = {"heldBy": "a", "mode": "exclusive", "leaseId": on_e1["leaseId"], "entityId": "e1"}
        two = {"heldBy": "a", "mode": "shared", "leaseId": on_e2["leaseId"], "entityId": "e2"}
        assert reply["seqs"] == [1, 3, 4, 5] and reply["duplicates"] == [1]
        assert reply["conflicts"] == [{**two, "seq": 4}, {**one, "seq": 4}, {**one, "seq": 5}]
        alerts = [await a.notification("lease.conflict", timeout=2) for _ in range(3)]
        assert sorted((n["params"]["body"]["seq"], n["params"]["body"]["entityId"]) for n in alerts) == \
            [(4, "e1"), (4, "e2"), (5, "e1")]
        events = (await b.call("session.get", {"sessionId": sid}))["events"]
        assert [(e["seq"], e["data"]["seq"]) for e in events if e["type"] == "conflict"] == [(2, 1), (6, 4), (7, 5)]


async def test_exclusive_is_all_or_nothing_and_shared_is_advisory(daemon: Daemon, namespace: str) -> None:
    async with rpc(daemon.port, token("a", namespace)) as a, rpc(daemon.port, token("b", namespace)) as b:
        await a.call("lease.acquire", {"entityIds": ["e2"], "ttl": 60, "mode": "exclusive"})
        refused = await b.call("lease.acquire", {"entityIds": ["e1", "e2", "e3"], "ttl": 60})
        assert refused["granted"] is False and [c["entityId"] for c in refused["conflicts"]] == ["e2"]
        assert (await b.call("lease.list", {"entityId": "e1"}))["leases"] == []  # e1 and e3 not granted either
        shared = await b.call("lease.acquire", {"entityIds": ["e2"], "ttl": 60, "mode": "shared"})
        assert shared["granted"] is True and [c["heldBy"] for c in shared["conflicts"]] == ["a"]
        listed = (await b.call("lease.list", {"entityId": "e2"}))["leases"]
        assert sorted((lease["agentId"], lease["mode"]) for lease in listed) == [("a", "exclusive"), ("b", "shared")]


async def test_renew_release_and_ownership(daemon: Daemon, namespace: str) -> None:
    async with rpc(daemon.port, token("a", namespace)) as a, rpc(daemon.port, token("b", namespace)) as b:
        lease = await a.call("lease.acquire", {"entityIds": ["x"], "ttl": 5})
        assert (await b.error("lease.renew", {"leaseId": lease["leaseId"], "ttl": 60}))["code"] == -32001
        assert (await b.error("lease.release", {"leaseId": lease["leaseId"]}))["code"] == -32001
        renewed = await a.call("lease.renew", {"leaseId": lease["leaseId"], "ttl": 600})
        assert renewed["expiresAt"] > lease["expiresAt"]
        assert await a.call("lease.release", {"leaseId": lease["leaseId"]}) == {"leaseId": lease["leaseId"],
                                                                                 "released": True}
        assert (await a.error("lease.release", {"leaseId": lease["leaseId"]}))["code"] == -32004
        assert (await b.call("lease.acquire", {"entityIds": ["x"], "ttl": 5}))["granted"] is True


async def test_a_stale_fencing_token_is_refused_and_writes_nothing(daemon: Daemon, namespace: str) -> None:
    async with rpc(daemon.port, token("a", namespace)) as a, rpc(daemon.port, token("b", namespace)) as b:
        sid = await session(a)
        await b.call("session.join", {"sessionId": sid})
        old = await a.call("lease.acquire", {"entityIds": ["x"], "ttl": 60})
        await a.call("lease.release", {"leaseId": old["leaseId"]})
        new = await b.call("lease.acquire", {"entityIds": ["x"], "ttl": 60})
        assert new["fencingToken"] > old["fencingToken"]  # tokens only grow per entity
        event = {"type": "modified", "changeInfo": {"entityIds": ["x"]}, "fencingToken": old["fencingToken"]}
        error = await a.error("event.emit", {"sessionId": sid, "event": event})
        assert error["code"] == -32009 and error["data"]["reason"] == "stale_lease"
        assert (await a.call("session.get", {"sessionId": sid}))["session"]["seq"] == 0
        good = await b.call("event.emit", {"sessionId": sid, "event": {**event, "fencingToken": new["fencingToken"]}})
        assert good == {"seq": 1, "duplicate": False}


@pytest.mark.parametrize(("params", "field"), [
    ({"entityIds": [], "ttl": 60}, "entityIds"),
    ({"entityIds": [f"e{i}" for i in range(65)], "ttl": 60}, "entityIds"),
    ({"entityIds": ["e"], "ttl": 4}, "ttl"),
    ({"entityIds": ["e"], "ttl": 3601}, "ttl"),
    ({"entityIds": ["e"], "ttl": 60, "mode": "mine"}, "mode"),
    ({"entityIds": ["bad\u0000id"], "ttl": 60}, "entityIds.0"),
    ({"entityIds": ["e"], "ttl": 60, "extra": 1}, "extra"),
])
async def test_bad_acquires_are_refused_and_write_nothing(daemon: Daemon, namespace: str, params: dict[str, Any],
                                                          field: str) -> None:
    async with rpc(daemon.port, token("a", namespace)) as a:
        error = await a.error("lease.acquire", params)
        assert error["code"] == -32602 and field in [item["field"] for item in error["data"]]
        assert (await a.call("lease.list", {}))["leases"] == []


async def test_orphaned_leases_are_released_once_their_agent_is_gone(backend_urls: Endpoints, tmp_path: Path,
                                                                     namespace: str) -> None:
    settings = make_settings(backend_urls, tmp_path, lease_orphan_grace=2.0, presence_idle=3.0)
    async with running(settings) as d, rpc(d.port, token("b", namespace)) as b:
        sid = await session(b)
        await b.call("session.subscribe", {"sessionId": sid})
        async with rpc(d.port, token("a", namespace)) as a:
            await a.call("session.join", {"sessionId": sid})
            await a.call("lease.acquire", {"entityIds": ["x"], "ttl": 3600})
            await anyio.sleep(3)  # longer than the grace: a connected agent keeps its lease
            assert len((await b.call("lease.list", {"agentId": "a"}))["leases"]) == 1
        left = await b.notification("session.presence", timeout=5)
        while left["params"]["status"] != "left":
            left = await b.notification("session.presence", timeout=5)
        assert left["params"] == {"sessionId": sid, "agentId": "a", "status": "left"}
        assert [p["agentId"] for p in (await b.call("presence.get", {"sessionId": sid}))["agents"]] == ["b"]
        with anyio.fail_after(10):
            while (await b.call("lease.list", {"agentId": "a"}))["leases"]:
                await anyio.sleep(0.2)


async def test_a_thousand_leases_and_64_agents_emitting_lose_and_double_no_alert(daemon: Daemon,
                                                                                 namespace: str) -> None:
    holders, emitters, per_agent = 4, 64, 4
    async with AsyncExitStack() as stack:
        owners = [await stack.enter_async_context(rpc(daemon.port, token(f"h{i}", namespace))) for i in range(holders)]
        for n in range(1000):
            granted = await owners[n % holders].call("lease.acquire", {"entityIds": [f"e{n}"], "ttl": 600})
            assert granted["granted"]
        agents = [await stack.enter_async_context(rpc(daemon.port, token(f"w{i}", namespace)))
                  for i in range(emitters)]
        sessions = [await session(agent) for agent in agents]

        async def work(i: int) -> None:
            for k in range(per_agent):
                entity = f"e{(i * per_agent + k) % 1000}"
                reply = await agents[i].call("event.emit", {"sessionId": sessions[i], "event": {
                    "id": f"ev{k}", "type": "modified", "changeInfo": {"entityIds": [entity]}}})
                assert [c["entityId"] for c in reply["conflicts"]] == [entity]
                again = await agents[i].call("event.emit", {"sessionId": sessions[i], "event": {
                    "id": f"ev{k}", "type": "modified", "changeInfo": {"entityIds": [entity]}}})
                assert again["duplicate"] is True and "conflicts" not in again  # a retry alerts nobody again

        async with anyio.create_task_group() as tg:
            for i in range(emitters):
                tg.start_soon(work, i)
        alerts: list[tuple[str, int]] = []
        for owner in owners:
            page: dict[str, Any] = {"nextSince": 0}
            while "nextSince" in page:
                page = await owner.call("mailbox.read", {"since": page["nextSince"], "limit": 1000})
                alerts += [(m["body"]["sessionId"], m["body"]["seq"]) for m in page["messages"]]
        assert len(alerts) == emitters * per_agent and len(set(alerts)) == len(alerts)
        for agent, sid in zip(agents, sessions, strict=True):
            types = [e["type"] for e in (await agent.call("session.get", {"sessionId": sid}))["events"]]
            assert types.count("conflict") == per_agent


async def test_the_handoff_context_lists_leases_and_open_conflicts_of_the_sessions_entities(
        daemon: Daemon, namespace: str) -> None:
    async with rpc(daemon.port, token("a", namespace)) as a, rpc(daemon.port, token("c", namespace)) as c:
        sid = (await a.call("session.create", {"entityIds": ["x", "y"]}))["sessionId"]
        mine = await a.call("lease.acquire", {"entityIds": ["x"], "ttl": 60})
        theirs = await c.call("lease.acquire", {"entityIds": ["y"], "ttl": 60, "mode": "shared"})
        await c.call("lease.acquire", {"entityIds": ["elsewhere"], "ttl": 60})
        handoff = await a.call("bridge.handoff", {"sessionId": sid})
        assert handoff["leases"] == [
            {"entityId": "x", "heldBy": "a", "leaseId": mine["leaseId"], "mode": "exclusive"},
            {"entityId": "y", "heldBy": "c", "leaseId": theirs["leaseId"], "mode": "shared"}]
        assert handoff["openConflicts"] == [handoff["leases"][1]]  # c is not an agent of the session


async def test_leases_are_namespace_isolated_and_list_takes_one_filter(daemon: Daemon, namespace: str) -> None:
    async with rpc(daemon.port, token("a", namespace)) as a, rpc(daemon.port, token("b", namespace + "x")) as b:
        assert (await a.call("lease.acquire", {"entityIds": ["x"], "ttl": 60}))["granted"] is True
        other = await b.call("lease.acquire", {"entityIds": ["x"], "ttl": 60})
        assert other["granted"] is True and other["conflicts"] == []  # another tenant's lease is invisible
        assert [lease["agentId"] for lease in (await b.call("lease.list", {}))["leases"]] == ["b"]
        error = await a.error("lease.list", {"entityId": "x", "agentId": "a"})
        assert error["code"] == -32602 and "not both" in error["data"][0]["message"]
        assert (await b.error("lease.release", {"leaseId": (await a.call("lease.list", {}))["leases"][0]["leaseId"]})
                )["code"] == -32004


async def test_a_graph_write_on_one_daemon_changes_what_the_next_lease_covers_on_another(
        backend_urls: Endpoints, tmp_path: Path, namespace: str, graph: Graph) -> None:
    await graph.query("CREATE (:CodebaseEntity {id: $file})", {"file": FILE})
    writer = token("w", namespace, scope="sessions:read sessions:write kg:write")
    async with two_daemons(backend_urls, tmp_path) as (d1, d2), rpc(d1.port, token("a", namespace)) as a, \
            rpc(d2.port, writer) as w:
        before = await a.call("lease.acquire", {"entityIds": [FILE], "ttl": 60})
        assert before["covers"] == []  # d1 has now cached the namespace's containment: none
        await a.call("lease.release", {"leaseId": before["leaseId"]})
        await w.call("kg.upsert", {"nodes": [{"id": LOGIN, "labels": ["CodebaseEntity"]}],
                                   "edges": [{"from": FILE, "to": LOGIN, "type": "DEFINES"}]})
        after = await a.call("lease.acquire", {"entityIds": [FILE], "ttl": 60})
        assert after["covers"] == [LOGIN]  # d1's grant saw the new graph version and read the graph again
        refused = await w.call("lease.acquire", {"entityIds": [LOGIN], "ttl": 60})
        assert refused["granted"] is False and refused["conflicts"][0]["via"] == FILE


async def test_kg_load_from_the_command_line_changes_what_the_next_lease_covers(
        backend_urls: Endpoints, daemon: Daemon, tmp_path: Path, namespace: str, graph: Graph) -> None:
    """`kg load` writes FalkorDB without a daemon: it still tells the daemons' coverage caches at once."""
    await graph.query("CREATE (:CodebaseEntity {id: $file})", {"file": FILE})
    async with rpc(daemon.port, token("a", namespace)) as a:
        before = await a.call("lease.acquire", {"entityIds": [FILE], "ttl": 60})
        assert before["covers"] == []  # the daemon has now cached the namespace's containment: none
        await a.call("lease.release", {"leaseId": before["leaseId"]})
        records = tmp_path / "kg.jsonl"
        records.write_text("\n".join(json.dumps(line) for line in (
            {"node": {"id": LOGIN, "labels": ["Symbol"]}},
            {"edge": {"from": FILE, "to": LOGIN, "type": "DEFINES"}})) + "\n")
        env = {**os.environ, "MEMENTO_REDIS_URL": backend_urls.redis_url, "MEMENTO_POSTGRES_DSN": "off",
               "MEMENTO_DATA_DIR": str(tmp_path / "cli"), "MEMENTO_LOG_LEVEL": "warning"}
        if (falkordb := falkordb_url(backend_urls)) is not None:
            env["MEMENTO_FALKORDB_URL"] = falkordb
        done = await anyio.run_process([sys.executable, "-m", "memento_sessions.cli", "kg", "load", str(records),
                                        "--namespace", namespace], env=env, check=False)
        assert done.returncode == 0, done.stderr.decode()
        after = await a.call("lease.acquire", {"entityIds": [FILE], "ttl": 60})
        assert after["covers"] == [LOGIN]  # well inside the 60 s the cache would otherwise be trusted


async def test_a_failed_reaper_pass_is_logged_and_the_next_one_still_reaps(backends: Backends, settings: Settings,
                                                                          namespace: str) -> None:
    """A pass that fails with something other than a Redis outage (here the namespaces set holding the wrong
    type, so its SMEMBERS is refused) once ended the reaper, and with it the daemon's task group."""
    store = CoordStore(backends.redis)
    await store.load()
    leases = Leases(store, None, settings)
    index = keys.coord_namespaces()
    members = [str(m) for m in await backends.redis.smembers(index)]
    await backends.redis.delete(index)
    await backends.redis.set(index, "not a set")
    with capture_logs() as entries:
        async with anyio.create_task_group() as tg:
            tg.start_soon(leases.reaper)
            with anyio.fail_after(5):
                while not [e for e in entries if e.get("job") == "lease reaper"]:
                    await anyio.sleep(0.05)
            await backends.redis.delete(index)
            if members:
                await backends.redis.sadd(index, *members)
            who = Identity("a", namespace, frozenset({"sessions:write"}))
            assert (await leases.acquire(who, ["x"], 1, "exclusive"))["granted"]  # 1 s: the API's floor is 5
            with anyio.fail_after(5):  # the reaper, still running, ends it
                while await backends.redis.hlen(keys.lease_keys(namespace).leases):
                    await anyio.sleep(0.05)
            tg.cancel_scope.cancel()
    failed = [e for e in entries if e.get("job") == "lease reaper"]
    assert failed[0]["log_level"] == "error" and failed[0]["exc_info"] is True


async def test_a_namespace_that_fails_its_reap_does_not_stop_the_others(backends: Backends, settings: Settings,
                                                                        namespace: str) -> None:
    """One namespace whose lease keys hold the wrong type used to end the whole pass (reap_once raised), so every
    namespace after it kept its expired and orphaned leases."""
    store = CoordStore(backends.redis)
    await store.load()
    leases = Leases(store, None, settings)
    broken, good = f"{namespace}-broken", f"{namespace}-good"
    for ns in (broken, good):
        who = Identity("a", ns, frozenset({"sessions:write"}))
        assert (await leases.acquire(who, ["x"], 1, "exclusive"))["granted"]
    await backends.redis.delete(keys.lease_keys(broken).expiry)
    await backends.redis.set(keys.lease_keys(broken).expiry, "not a zset")
    await anyio.sleep(1.1)  # the good namespace's lease expires
    with capture_logs() as entries:
        await leases.reap_once()
    assert await backends.redis.hlen(keys.lease_keys(good).leases) == 0
    failed = [e for e in entries if e.get("job") == "lease reaper"]
    assert len(failed) == 1 and failed[0]["log_level"] == "error"
    await backends.redis.delete(*keys.lease_keys(broken).all())


async def test_an_old_coverage_cache_is_reloaded_by_the_reaper_loop_not_by_an_acquire(
        backends: Backends, settings: Settings, namespace: str, graph: Graph, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write that bypasses every daemon (straight to FalkorDB) is seen once the cache is MAX_AGE old: the
    reaper's loop reloads it then, so no acquire waits for FalkorDB's read of every containment edge."""
    monkeypatch.setattr(coverage, "MAX_AGE", 0.5)
    await graph.query("CREATE (:CodebaseEntity {id: $file})", {"file": FILE})
    store = CoordStore(backends.redis)
    await store.load()
    leases = Leases(store, Graphs(backends), settings)
    version, pairs = await leases.coverage.covered(namespace, [FILE])
    assert pairs == [(FILE, "")]
    await graph.query("MATCH (f:CodebaseEntity {id: $file}) CREATE (f)-[:DEFINES]->(:Symbol {id: $sym})",
                      {"file": FILE, "sym": LOGIN})
    async with anyio.create_task_group() as tg:
        tg.start_soon(leases.reaper)
        with anyio.fail_after(5):
            while (leases.coverage._cache[namespace].inner or {}).get(FILE) is None:
                await anyio.sleep(0.05)
        tg.cancel_scope.cancel()
    assert await leases.coverage.covered(namespace, [FILE]) == (version, [(FILE, ""), (LOGIN, FILE)])
