"""SessionBridge over the real daemon, Redis, FalkorDB and Postgres, on a small graph whose answers are known.

The graph (loaded with kg.upsert into the test's namespace):

    fn:login, fn:refresh, fn:logout -MEMBER_OF_CLUSTER-> cluster:auth "Auth sessions"
    fn:invoice -MEMBER_OF_CLUSTER-> cluster:billing "Billing"
    cluster:auth -IMPLEMENTS_CLUSTER-> spec:login "Login flow", spec:tokens "Token refresh"
    cluster:billing -IMPLEMENTS_CLUSTER-> spec:invoices "Invoices"
    fn:refresh -IMPACTS-> spec:tokens
    bench:login-p99 (-10.0) -PERFORMS_FOR-> fn:login; bench:auth-throughput (2.5) -PERFORMS_FOR-> cluster:auth
    bench:invoice (4.0) -PERFORMS_FOR-> fn:invoice
    test:login -TESTS-> fn:login; test:refresh -TESTS-> fn:refresh
    fn:login -DEFINES-> sym:login, sym:LoginForm; fn:logout -DEFINES-> sym:logout

The session (alice creates it on fn:login; bob joins):

    1 alice start fn:login          7 alice modified fn:invoice, stateTransition to broken, -1.0
    2 alice modified fn:login -3.0  8 bob broke fn:logout (already broken: no transition)
    3 bob modified fn:refresh 1.5   9 bob test_pass
    4 bob broke fn:refresh high 2.0 10 bob modified fn:ghost 3.0 (no such entity in the graph)
    5 alice test_pass  -> cp1       11 bob broke fn:ghost critical 1.0 -> cp2 (broken: failure snapshot)
    6 alice modified fn:invoice 0.5
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from prometheus_client import REGISTRY

from memento_sessions import keys
from memento_sessions.backends import falkordb_client
from memento_sessions.bridge.timeline import breakages
from memento_sessions.endpoints import Endpoints
from memento_sessions.kg.fixture import generate
from memento_sessions.kg.loader import parse_lines
from memento_sessions.server.daemon import Daemon
from memento_sessions.settings import Settings
from tests.helpers import falkordb_url, make_settings, token
from tests.rpcsocket import RpcSocket, rpc

pytestmark = pytest.mark.anyio
ALL = "sessions:read sessions:write kg:write"


def n(node_id: str, label: str, **props: Any) -> dict[str, Any]:
    return {"id": node_id, "labels": [label], "props": props}


def e(src: str, rel: str, dst: str) -> dict[str, str]:
    return {"from": src, "to": dst, "type": rel}


NODES = [
    n("cluster:auth", "SemanticCluster", name="Auth sessions"), n("cluster:billing", "SemanticCluster", name="Billing"),
    n("spec:login", "Spec", title="Login flow"), n("spec:tokens", "Spec", title="Token refresh"),
    n("spec:invoices", "Spec", title="Invoices"),
    n("bench:login-p99", "Benchmark", name="login p99", perfDelta=-10.0),
    n("bench:auth-throughput", "Benchmark", name="auth throughput", perfDelta=2.5),
    n("bench:invoice", "Benchmark", name="invoice render", perfDelta=4.0),
    n("fn:login", "CodebaseEntity", name="login"), n("fn:refresh", "CodebaseEntity", name="refresh"),
    n("fn:logout", "CodebaseEntity", name="logout"), n("fn:invoice", "CodebaseEntity", name="invoice"),
    n("test:login", "Test", name="test_login"), n("test:refresh", "Test", name="test_refresh"),
    n("sym:login", "Symbol", name="login"), n("sym:LoginForm", "Symbol", name="LoginForm"),
    n("sym:logout", "Symbol", name="logout"),
]
EDGES = [
    e("fn:login", "MEMBER_OF_CLUSTER", "cluster:auth"), e("fn:refresh", "MEMBER_OF_CLUSTER", "cluster:auth"),
    e("fn:logout", "MEMBER_OF_CLUSTER", "cluster:auth"), e("fn:invoice", "MEMBER_OF_CLUSTER", "cluster:billing"),
    e("cluster:auth", "IMPLEMENTS_CLUSTER", "spec:login"), e("cluster:auth", "IMPLEMENTS_CLUSTER", "spec:tokens"),
    e("cluster:billing", "IMPLEMENTS_CLUSTER", "spec:invoices"), e("fn:refresh", "IMPACTS", "spec:tokens"),
    e("bench:login-p99", "PERFORMS_FOR", "fn:login"), e("bench:auth-throughput", "PERFORMS_FOR", "cluster:auth"),
    e("bench:invoice", "PERFORMS_FOR", "fn:invoice"),
    e("test:login", "TESTS", "fn:login"), e("test:refresh", "TESTS", "fn:refresh"),
    e("fn:login", "DEFINES", "sym:login"), e("fn:login", "DEFINES", "sym:LoginForm"),
    e("fn:logout", "DEFINES", "sym:logout"),
]


def change(entity: str, operation: str = "modified") -> dict[str, Any]:
    return {"entityIds": [entity], "operation": operation}


@pytest.fixture
def settings(backend_urls: Endpoints, tmp_path: Path) -> Settings:
    """No automatic checkpoints: the test places both checkpoints itself."""
    return make_settings(backend_urls, tmp_path, checkpoint_every=1000)


async def emit(peer: RpcSocket, sid: str, event: dict[str, Any]) -> int:
    seq: int = (await peer.call("event.emit", {"sessionId": sid, "event": event}))["seq"]
    return seq


async def scenario(daemon: Daemon, ns: str, checkpoints: bool = True) -> tuple[str, list[str]]:
    """Load the graph, play the session of the module docstring; returns its id and checkpoint ids."""
    cps: list[str] = []
    async with rpc(daemon.port, token("alice", ns, ALL)) as alice, rpc(daemon.port, token("bob", ns)) as bob:
        assert await alice.call("kg.upsert", {"nodes": NODES, "edges": EDGES}) == {"nodes": 17, "edges": 16}
        sid = (await alice.call("session.create", {"entityIds": ["fn:login"]}))["sessionId"]
        await bob.call("session.join", {"sessionId": sid})
        assert await emit(alice, sid, {"type": "modified", "changeInfo": change("fn:login"),
                                       "impact": {"perfDelta": -3.0}}) == 2
        await emit(bob, sid, {"type": "modified", "changeInfo": change("fn:refresh"), "impact": {"perfDelta": 1.5}})
        await emit(bob, sid, {"type": "broke", "changeInfo": change("fn:refresh"),
                              "impact": {"severity": "high", "perfDelta": 2.0, "testsFailed": ["test:refresh"]}})
        assert await emit(alice, sid, {"type": "test_pass"}) == 5
        if checkpoints:
            cps.append((await alice.call("session.checkpoint", {"sessionId": sid}))["checkpointId"])
        await emit(alice, sid, {"type": "modified", "changeInfo": change("fn:invoice"), "impact": {"perfDelta": 0.5}})
        await emit(alice, sid, {"type": "modified", "changeInfo": change("fn:invoice"),
                                "stateTransition": {"from": "working", "to": "broken", "verifiedBy": "test"},
                                "impact": {"severity": "low", "perfDelta": -1.0}})
        await emit(bob, sid, {"type": "broke", "changeInfo": change("fn:logout")})
        await emit(bob, sid, {"type": "test_pass"})
        await emit(bob, sid, {"type": "modified", "changeInfo": change("fn:ghost"), "impact": {"perfDelta": 3.0}})
        assert await emit(bob, sid, {"type": "broke", "changeInfo": change("fn:ghost"),
                                     "impact": {"severity": "critical", "perfDelta": 1.0}}) == 11
        if checkpoints:
            done = await alice.call("session.checkpoint", {"sessionId": sid})
            assert done["outcome"] == "broken" and "snapshotId" in done, done
            cps.append(done["checkpointId"])
    return sid, cps


T1 = {"fromSeq": 1, "toSeq": 4, "changeInfo": {"entityIds": ["fn:refresh"], "operation": "modified"},
      "impact": {"severity": "high", "testsFailed": ["test:refresh"], "perfDelta": 2.0},
      "kgContext": {"entityIds": ["fn:login", "fn:refresh"], "specTitles": ["Login flow", "Token refresh"],
                    "clusterNames": ["Auth sessions"], "benchmarkDelta": -7.5}}
T2 = {"fromSeq": 5, "toSeq": 7, "changeInfo": {"entityIds": ["fn:invoice"], "operation": "modified"},
      "impact": {"severity": "low", "testsFailed": [], "perfDelta": -1.0},
      "kgContext": {"entityIds": ["fn:invoice"], "specTitles": ["Invoices"], "clusterNames": ["Billing"],
                    "benchmarkDelta": 4.0}}
T3 = {"fromSeq": 9, "toSeq": 11, "changeInfo": {"entityIds": ["fn:ghost"], "operation": "modified"},
      "impact": {"severity": "critical", "testsFailed": [], "perfDelta": 1.0}}


async def test_transitions_are_the_working_to_broken_changes_with_their_kg_context(daemon: Daemon,
                                                                                  namespace: str) -> None:
    sid, _ = await scenario(daemon, namespace, checkpoints=False)
    async with rpc(daemon.port, token("carol", namespace, "sessions:read")) as carol:
        assert await carol.call("bridge.transitions", {"sessionId": sid}) == {
            "transitions": [T1, T2, T3], "source": "live"}
        by_entity = await carol.call("bridge.transitions", {"sessionId": sid, "entityId": "fn:login"})
        assert by_entity == {"transitions": [T1], "source": "live"}, "fn:login changed in the window 2..4"
        logout = await carol.call("bridge.transitions", {"sessionId": sid, "entityId": "fn:logout"})
        assert logout == {"transitions": [], "source": "live"}, "seq 8 broke an already broken session"


async def test_isolate_gives_an_agents_events_anchors_per_entity_and_perf_sum(daemon: Daemon, namespace: str) -> None:
    sid, (cp1, cp2) = await scenario(daemon, namespace)
    async with rpc(daemon.port, token("carol", namespace, "sessions:read")) as carol:
        bob = await carol.call("bridge.isolate", {"sessionId": sid, "agentId": "bob"})
        alice = await carol.call("bridge.isolate", {"sessionId": sid, "agentId": "alice"})
        nobody = await carol.call("bridge.isolate", {"sessionId": sid, "agentId": "dave"})
    assert [ev["seq"] for ev in bob["events"]] == [3, 4, 8, 9, 10, 11]
    assert {ev["actor"] for ev in bob["events"]} == {"bob"}
    assert [(i["entityId"], [a["checkpointId"] for a in i["anchors"]], i["count"]) for i in bob["impacts"]] == [
        ("fn:ghost", [cp2], 1), ("fn:logout", [cp2], 1), ("fn:refresh", [cp1], 1)]
    assert (bob["agentId"], bob["totalPerfDelta"], bob["source"]) == ("bob", 7.5, "live")
    anchor = bob["impacts"][2]["anchors"][0]
    assert {k: anchor[k] for k in ("sessionId", "outcome", "brokeDuring", "keyImpacts", "perfDelta", "actors",
                                   "fromSeq", "toSeq")} == {
        "sessionId": sid, "outcome": "working", "brokeDuring": True, "keyImpacts": ["fn:refresh:high"],
        "perfDelta": 0.5, "actors": ["alice", "bob"], "fromSeq": 1, "toSeq": 5}
    assert [ev["seq"] for ev in alice["events"]] == [1, 2, 5, 6, 7]
    assert [(i["entityId"], [a["checkpointId"] for a in i["anchors"]]) for i in alice["impacts"]] == [
        ("fn:invoice", [cp2]), ("fn:login", [cp1])]
    assert alice["totalPerfDelta"] == -3.5
    usage = nobody.pop("usage")  # the session's usage totals (tests/test_usage_get.py): no run here
    assert nobody == {"agentId": "dave", "events": [], "impacts": [], "totalPerfDelta": 0.0, "source": "live"}
    assert (usage["runs"], usage["inputTokens"], usage["costUsd"]) == (0, 0, None)


RELATED = {
    "fn:login": [
        {"id": "bench:login-p99", "label": "Benchmark", "relation": "PERFORMS_FOR", "name": "login p99",
         "perfDelta": -10.0},
        {"id": "sym:LoginForm", "label": "Symbol", "relation": "DEFINES", "name": "LoginForm"},
        {"id": "sym:login", "label": "Symbol", "relation": "DEFINES", "name": "login"},
        {"id": "test:login", "label": "Test", "relation": "TESTS", "name": "test_login"}],
    "fn:refresh": [{"id": "test:refresh", "label": "Test", "relation": "TESTS", "name": "test_refresh"}],
    "fn:invoice": [{"id": "bench:invoice", "label": "Benchmark", "relation": "PERFORMS_FOR",
                    "name": "invoice render", "perfDelta": 4.0}],
    "fn:logout": [{"id": "sym:logout", "label": "Symbol", "relation": "DEFINES", "name": "logout"}],
    "fn:ghost": [],  # created as a stub by the checkpoint's anchor
}


def context_summary(context: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]], str | None]]:
    return [(c["entityId"], c["related"], (c["lastAnchor"] or {}).get("checkpointId")) for c in context]


async def test_handoff_gives_state_agents_last_ten_events_and_the_kg_around_them(daemon: Daemon,
                                                                                namespace: str) -> None:
    sid, (cp1, cp2) = await scenario(daemon, namespace)
    async with rpc(daemon.port, token("carol", namespace, "sessions:read")) as carol:
        handoff = await carol.call("bridge.handoff", {"sessionId": sid})
    assert (handoff["sessionId"], handoff["state"], handoff["agentIds"]) == (sid, "broken", ["alice", "bob"])
    assert [ev["seq"] for ev in handoff["recentChanges"]] == list(range(2, 12))
    assert context_summary(handoff["kgContext"]) == [
        ("fn:login", RELATED["fn:login"], cp1), ("fn:refresh", RELATED["fn:refresh"], cp1),
        ("fn:invoice", RELATED["fn:invoice"], cp2), ("fn:logout", RELATED["fn:logout"], cp2),
        ("fn:ghost", [], cp2)]
    assert handoff["joiningAdvice"] == (
        "Broken at seq 11 by bob (fn:ghost): fix it before new work. Sync with agents: alice, bob. "
        "Recent changes touched fn:login, fn:refresh, fn:invoice and 2 more.")
    assert handoff["source"] == "live"


async def test_outcomes_sum_up_a_clusters_recent_anchors(daemon: Daemon, namespace: str) -> None:
    sid, (cp1, cp2) = await scenario(daemon, namespace)
    async with rpc(daemon.port, token("carol", namespace, "sessions:read")) as carol:
        auth = await carol.call("bridge.outcomes", {"clusterId": "cluster:auth"})
        billing = await carol.call("bridge.outcomes", {"clusterId": "cluster:billing", "days": 1})
        unknown = await carol.call("bridge.outcomes", {"clusterId": "cluster:nope"})
    assert (auth["clusterName"], auth["specTitles"]) == ("Auth sessions", ["Login flow", "Token refresh"])
    assert [(a["checkpointId"], a["entityIds"], a["outcome"], a["perfDelta"]) for a in auth["recentSessions"]] == [
        (cp2, ["fn:logout"], "broken", 3.5), (cp1, ["fn:login", "fn:refresh"], "working", 0.5)]
    assert {a["sessionId"] for a in auth["recentSessions"]} == {sid}
    for anchor in auth["recentSessions"]:  # ISO-8601 as every method's timestamps, within the last minute
        at = datetime.fromisoformat(anchor["timestamp"].replace("Z", "+00:00"))
        assert anchor["timestamp"].endswith("Z") and abs((datetime.now(UTC) - at).total_seconds()) < 60
    assert (auth["avgPerfDelta"], auth["brokenCount"]) == (2.0, 1)
    assert (billing["clusterName"], billing["specTitles"], billing["avgPerfDelta"], billing["brokenCount"]) == (
        "Billing", ["Invoices"], 3.5, 1)
    assert [a["checkpointId"] for a in billing["recentSessions"]] == [cp2]
    assert unknown == {"clusterName": None, "specTitles": [], "recentSessions": [], "avgPerfDelta": None,
                       "brokenCount": 0}


async def test_outcomes_leave_out_anchors_older_than_days(daemon: Daemon, namespace: str,
                                                          backend_urls: Endpoints) -> None:
    _, (cp1, cp2) = await scenario(daemon, namespace)
    db = falkordb_client(falkordb_url(backend_urls) or backend_urls.redis_url)
    await db.select_graph(f"memento_{namespace}").query(
        "MATCH (a:SessionAnchor {checkpointId: $id}) SET a.timestamp = timestamp() - 3 * 86400000", {"id": cp1})
    await db.connection.aclose()
    async with rpc(daemon.port, token("carol", namespace, "sessions:read")) as carol:
        two = await carol.call("bridge.outcomes", {"clusterId": "cluster:auth", "days": 2})
        four = await carol.call("bridge.outcomes", {"clusterId": "cluster:auth", "days": 4})
    assert ([a["checkpointId"] for a in two["recentSessions"]], two["avgPerfDelta"]) == ([cp2], 3.5)
    assert ([a["checkpointId"] for a in four["recentSessions"]], four["avgPerfDelta"]) == ([cp2, cp1], 2.0)


async def expire(settings: Settings, ns: str, sid: str) -> None:
    """What Redis does when the session's TTL runs out: every key of the session is gone."""
    r = aioredis.Redis.from_url(settings.redis_url or "", decode_responses=True)
    assert await r.delete(*keys.session_keys(ns, sid).all()) >= 2
    await r.aclose()


async def test_after_expiry_every_query_answers_from_anchors_and_the_snapshot(daemon: Daemon, namespace: str,
                                                                             settings: Settings) -> None:
    sid, (cp1, cp2) = await scenario(daemon, namespace)
    await expire(settings, namespace, sid)
    async with rpc(daemon.port, token("carol", namespace, "sessions:read")) as carol:
        assert (await carol.error("session.get", {"sessionId": sid}))["code"] == -32004
        transitions = await carol.call("bridge.transitions", {"sessionId": sid})
        bob = await carol.call("bridge.isolate", {"sessionId": sid, "agentId": "bob"})
        handoff = await carol.call("bridge.handoff", {"sessionId": sid})
    assert transitions == {"transitions": [T1, T2, T3], "source": "archive"}, "rebuilt from the 11-event snapshot"
    assert [ev["seq"] for ev in bob["events"]] == [3, 4, 8, 9, 10, 11]
    assert [(i["entityId"], [a["checkpointId"] for a in i["anchors"]]) for i in bob["impacts"]] == [
        ("fn:ghost", [cp2]), ("fn:logout", [cp2]), ("fn:refresh", [cp1])]
    assert (bob["totalPerfDelta"], bob["source"]) == (7.5, "archive")
    assert (handoff["state"], handoff["agentIds"], handoff["source"]) == ("broken", ["alice", "bob"], "archive")
    assert [ev["seq"] for ev in handoff["recentChanges"]] == list(range(2, 12))
    assert context_summary(handoff["kgContext"])[0] == ("fn:login", RELATED["fn:login"], cp1)
    assert handoff["joiningAdvice"] == (
        "Session expired; rebuilt from 2 anchors and a failure snapshot of 11 events, last outcome broken: "
        "start a new session to continue. Sync with agents: alice, bob. "
        "Recent changes touched fn:login, fn:refresh, fn:invoice and 2 more.")


async def test_after_expiry_without_a_snapshot_transitions_come_from_the_anchor_windows(
        daemon: Daemon, namespace: str, settings: Settings) -> None:
    async with rpc(daemon.port, token("alice", namespace, ALL)) as alice:
        await alice.call("kg.upsert", {"nodes": NODES, "edges": EDGES})
        sid = (await alice.call("session.create", {"entityIds": ["fn:login"]}))["sessionId"]
        await emit(alice, sid, {"type": "broke", "changeInfo": change("fn:refresh"),
                                "impact": {"severity": "critical", "perfDelta": 6.0}})
        await emit(alice, sid, {"type": "test_pass"})
        cp = (await alice.call("session.checkpoint", {"sessionId": sid}))["checkpointId"]
    await expire(settings, namespace, sid)
    async with rpc(daemon.port, token("carol", namespace, "sessions:read")) as carol:
        transitions = await carol.call("bridge.transitions", {"sessionId": sid})
        handoff = await carol.call("bridge.handoff", {"sessionId": sid})
        alone = await carol.call("bridge.isolate", {"sessionId": sid, "agentId": "alice"})
    assert transitions == {"source": "archive", "transitions": [{
        "fromSeq": 1, "toSeq": 3, "checkpointId": cp, "changeInfo": {"entityIds": ["fn:login", "fn:refresh"]},
        "impact": {"perfDelta": 6.0, "keyImpacts": ["fn:refresh:critical"]}, "kgContext": T1["kgContext"]}]}
    assert (handoff["state"], handoff["agentIds"], handoff["recentChanges"]) == ("working", ["alice"], [])
    assert [c["entityId"] for c in handoff["kgContext"]] == ["fn:login", "fn:refresh"], "the last anchor's entities"
    assert handoff["joiningAdvice"] == (
        "Session expired; rebuilt from 1 anchor, last outcome working: start a new session to continue. "
        "Sync with agents: alice. Recent changes touched fn:login, fn:refresh.")
    assert [(i["entityId"], i["count"]) for i in alone["impacts"]] == [("fn:login", 1), ("fn:refresh", 1)]
    assert (alone["events"], alone["totalPerfDelta"]) == ([], 6.0)


async def test_a_namespace_never_sees_another_namespaces_graph_or_sessions(daemon: Daemon, namespace: str,
                                                                           settings: Settings) -> None:
    other = namespace + "x"
    secret_sid, _ = await scenario(daemon, other, checkpoints=False)
    async with rpc(daemon.port, token("eve", namespace)) as eve:
        sid = (await eve.call("session.create", {"entityIds": ["fn:login"]}))["sessionId"]
        await emit(eve, sid, {"type": "broke", "changeInfo": change("fn:invoice")})
        assert await eve.call("bridge.transitions", {"sessionId": sid}) == {"source": "live", "transitions": [
            {"fromSeq": 1, "toSeq": 2, "changeInfo": change("fn:invoice"), "impact": None}]}
        handoff = await eve.call("bridge.handoff", {"sessionId": sid})
        assert handoff["kgContext"] == [], "fn:login and fn:invoice exist only in the other namespace's graph"
        assert await eve.call("bridge.outcomes", {"clusterId": "cluster:auth"}) == {
            "clusterName": None, "specTitles": [], "recentSessions": [], "avgPerfDelta": None, "brokenCount": 0}
        for method, params in [("bridge.transitions", {}), ("bridge.handoff", {}),
                               ("bridge.isolate", {"agentId": "alice"})]:
            error = await eve.error(method, {"sessionId": secret_sid, **params})
            assert error["code"] == -32004, (method, error)
    r = aioredis.Redis.from_url(settings.redis_url or "")
    assert await r.exists(f"memento_{namespace}") == 0, "a bridge query never creates a graph"
    await r.aclose()


async def test_bridge_methods_validate_params_and_need_sessions_read(daemon: Daemon, namespace: str) -> None:
    async with rpc(daemon.port, token("mallory", namespace, "kg:write")) as no_read:
        assert (await no_read.error("bridge.handoff", {"sessionId": "s"}))["code"] == -32001
    async with rpc(daemon.port, token("carol", namespace, "sessions:read")) as carol:
        bad = await carol.error("bridge.outcomes", {"clusterId": "cluster:auth", "days": 0})
        assert (bad["code"], [d["field"] for d in bad["data"]]) == (-32602, ["days"])
        missing = await carol.error("bridge.isolate", {"sessionId": "s"})
        assert (missing["code"], [d["field"] for d in missing["data"]]) == (-32602, ["agentId"])
        assert (await carol.error("bridge.handoff", {"sessionId": "never-was"}))["code"] == -32004


async def test_every_query_is_timed_into_the_histogram(daemon: Daemon, namespace: str) -> None:
    def count(query: str) -> float:
        return REGISTRY.get_sample_value("memento_bridge_query_seconds_count", {"query": query}) or 0.0

    before = {q: count(q) for q in ("transitions", "isolate", "handoff", "outcomes")}
    async with rpc(daemon.port, token("carol", namespace)) as carol:
        sid = (await carol.call("session.create", {}))["sessionId"]
        await carol.call("bridge.transitions", {"sessionId": sid})
        await carol.call("bridge.isolate", {"sessionId": sid, "agentId": "carol"})
        await carol.call("bridge.handoff", {"sessionId": sid})
        await carol.call("bridge.handoff", {"sessionId": sid})
        await carol.call("bridge.outcomes", {"clusterId": "c"})
    assert {q: count(q) - before[q] for q in before} == {"transitions": 1, "isolate": 1, "handoff": 2, "outcomes": 1}


def test_the_fixture_graph_is_deterministic_and_valid_for_the_loader() -> None:
    lines = subprocess.run([sys.executable, "-m", "memento_sessions.kg.fixture", "--entities", "300"],
                           check=True, capture_output=True, text=True).stdout.splitlines()
    assert lines == [json.dumps(r, separators=(",", ":")) for r in generate(300)], "same size and seed, same lines"
    nodes, edges = parse_lines(lines)
    labels: dict[str, int] = {}
    for node in nodes:
        labels[node.labels[0]] = labels.get(node.labels[0], 0) + 1
    assert {k: labels[k] for k in ("CodebaseEntity", "SemanticCluster", "Benchmark", "Test")} == {
        "CodebaseEntity": 300, "SemanticCluster": 3, "Benchmark": 6, "Test": 150}
    assert labels["Spec"] >= 3 and 300 <= labels["Symbol"] <= 900
    ids = {node.id for node in nodes}
    assert all(edge.from_ in ids and edge.to in ids for edge in edges), "no edge points at a missing node"
    members = [edge for edge in edges if edge.type == "MEMBER_OF_CLUSTER"]
    assert len(members) == 300 and len({edge.from_ for edge in members}) == 300, "every entity in one cluster"


async def test_a_generated_graph_answers_bridge_queries(daemon: Daemon, namespace: str) -> None:
    records = list(generate(200, seed=3))
    nodes = [r["node"] for r in records if "node" in r]
    edges = [r["edge"] for r in records if "edge" in r]
    entity = next(node for node in nodes if "CodebaseEntity" in node["labels"])
    cluster_of = next(edge["to"] for edge in edges if edge["from"] == entity["id"] and edge["type"] ==
                      "MEMBER_OF_CLUSTER")
    cluster = next(node for node in nodes if node["id"] == cluster_of)
    async with rpc(daemon.port, token("gen", namespace, ALL)) as peer:
        assert await peer.call("kg.upsert", {"nodes": nodes, "edges": edges}) == {"nodes": len(nodes),
                                                                                   "edges": len(edges)}
        sid = (await peer.call("session.create", {}))["sessionId"]
        await emit(peer, sid, {"type": "broke", "changeInfo": change(entity["id"])})
        (transition,) = (await peer.call("bridge.transitions", {"sessionId": sid}))["transitions"]
        handoff = await peer.call("bridge.handoff", {"sessionId": sid})
        outcomes = await peer.call("bridge.outcomes", {"clusterId": cluster_of})
    assert transition["kgContext"]["clusterNames"] == [cluster["props"]["name"]]
    assert transition["kgContext"]["specTitles"], "every cluster implements at least one spec"
    (context,) = handoff["kgContext"]
    assert {item["label"] for item in context["related"]} >= {"Symbol"}, "every entity defines a symbol"
    assert outcomes["clusterName"] == cluster["props"]["name"]


def test_from_seq_is_the_last_event_that_showed_the_session_working() -> None:
    def ev(seq: int, kind: str, to: str | None = None, entity: str | None = None) -> dict[str, Any]:
        event: dict[str, Any] = {"seq": seq, "type": kind}
        if to:
            event["stateTransition"] = {"to": to}
        if entity:
            event["changeInfo"] = {"entityIds": [entity]}
        return event

    assert [(b.from_seq, b.to_seq, b.window) for b in breakages([ev(1, "broke", entity="a")])] == [
        (0, 1, ("a",))], "broken by the first event: nothing showed it working yet"
    events = [ev(1, "modified", entity="a"), ev(2, "note", to="working"), ev(3, "modified", entity="b"),
              ev(4, "modified", to="broken", entity="c"), ev(5, "test_pass"), ev(6, "broke"), ev(7, "broke")]
    assert [(b.from_seq, b.to_seq, b.window) for b in breakages(events)] == [(2, 4, ("b", "c")), (5, 6, ())]
    assert [b.to_seq for b in breakages(events, "a")] == [], "a changed before the session last worked"
    many = [ev(i, "modified", entity=f"e{i}") for i in range(1, 9)] + [ev(9, "modified", entity="e2"), ev(10, "broke")]
    (long_window,) = breakages(many)
    assert long_window.window == ("e5", "e6", "e7", "e8", "e2"), "the five changed last, e2 re-changed last"
    assert [b.to_seq for b in breakages(many, "e1")] == [10], "the filter still sees the whole window"
