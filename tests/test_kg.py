"""Loading the knowledge graph (JSON Lines) and the `kg load` and `prune` commands."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from falkordb import FalkorDB

from memento_sessions import keys
from memento_sessions.backends import Backends, open_backends
from memento_sessions.checkpoints.aggregate import Summary
from memento_sessions.checkpoints.anchors import write_anchor
from memento_sessions.checkpoints.snapshots import Snapshots, partition_name
from memento_sessions.endpoints import Endpoints
from memento_sessions.kg.graph import Graph, Graphs
from memento_sessions.kg.loader import BATCH, BadRecord, EdgeRecord, NodeRecord, load_file, parse_lines, upsert
from memento_sessions.settings import Settings
from tests.helpers import falkordb_url

GOOD = [
    {"node": {"id": "cluster:auth", "labels": ["SemanticCluster"], "props": {"name": "Auth"}}},
    {"node": {"id": "spec:login", "labels": ["Spec"], "props": {"title": "Login v2", "tags": ["auth", "v2"]}}},
    {"node": {"id": "src/auth.py::login", "labels": ["CodebaseEntity"], "props": {"loc": 42}}},
    {"edge": {"from": "src/auth.py::login", "to": "cluster:auth", "type": "MEMBER_OF_CLUSTER", "props": {}}},
    {"edge": {"from": "cluster:auth", "to": "spec:login", "type": "IMPLEMENTS_CLUSTER", "props": {"since": 3}}},
    {"edge": {"from": "test:login", "to": "src/auth.py::login", "type": "TESTS"}},
]


def jsonl(records: list[Any]) -> str:
    return "".join((record if isinstance(record, str) else json.dumps(record)) + "\n" for record in records)


async def rows(graph: Graph, query: str) -> list[list[Any]]:
    return list((await graph.query(query)).result_set)


@pytest.mark.anyio
async def test_upsert_merges_nodes_and_edges_by_id(graph: Graph) -> None:
    nodes, edges = parse_lines(jsonl(GOOD).splitlines())
    assert await upsert(graph, nodes, edges) == (3, 3)
    assert await upsert(graph, nodes, edges) == (3, 3)  # merged again: nothing doubles
    found = await rows(graph, "MATCH (n) RETURN n.id, labels(n), n.stub ORDER BY n.id")
    assert found == [
        ["cluster:auth", ["CodebaseEntity", "SemanticCluster"], None],
        ["spec:login", ["CodebaseEntity", "Spec"], None],
        ["src/auth.py::login", ["CodebaseEntity"], None],
        ["test:login", ["CodebaseEntity"], True],  # an edge end never loaded is a stub
    ]
    assert await rows(graph, "MATCH (a)-[r]->(b) RETURN a.id, type(r), r.since, b.id ORDER BY a.id") == [
        ["cluster:auth", "IMPLEMENTS_CLUSTER", 3, "spec:login"],
        ["src/auth.py::login", "MEMBER_OF_CLUSTER", None, "cluster:auth"],
        ["test:login", "TESTS", None, "src/auth.py::login"],
    ]
    assert await rows(graph, "MATCH (s:Spec) RETURN s.title, s.tags") == [["Login v2", ["auth", "v2"]]]


@pytest.mark.anyio
async def test_loading_a_stub_fills_it_in(graph: Graph) -> None:
    await upsert(graph, [], [EdgeRecord.model_validate({"from": "a", "to": "b", "type": "DEFINES"})])
    await upsert(graph, [NodeRecord(id="b", labels=["Symbol"], props={"kind": "function"})], [])
    assert await rows(graph, "MATCH (n {id: 'b'}) RETURN labels(n), n.stub, n.kind") == [
        [["CodebaseEntity", "Symbol"], None, "function"]]


@pytest.mark.anyio
async def test_upsert_in_batches_reports_progress(graph: Graph) -> None:
    nodes = [NodeRecord(id=f"fn-{i}", labels=["CodebaseEntity"]) for i in range(BATCH * 2 + 10)]
    edges = [EdgeRecord.model_validate({"from": f"fn-{i}", "to": f"fn-{i + 1}", "type": "REQUIRES"})
             for i in range(BATCH + 1)]
    progress: list[tuple[int, int]] = []
    assert await upsert(graph, nodes, edges, lambda done, total: progress.append((done, total))) == (1010, 501)
    assert progress == [(500, 1511), (1000, 1511), (1010, 1511), (1510, 1511), (1511, 1511)]
    assert await rows(graph, "MATCH (n) RETURN count(n)") == [[1010]]
    assert await rows(graph, "MATCH ()-[r:REQUIRES]->() RETURN count(r)") == [[501]]


def test_graph_names_read_back_to_their_namespace() -> None:
    """keys.graph_name and its reverse, keys.graph_namespace (retention finds the namespaces by it)."""
    assert [keys.graph_name("memento", ns) for ns in ("default", "team-a", "a_b")] == [
        "memento", "memento_team-a", "memento_a_b"]
    for ns in ("default", "team-a", "a_b", "memento"):
        assert keys.graph_namespace("memento", keys.graph_name("memento", ns)) == ns
    assert [keys.graph_namespace("memento", name) for name in ("mementos", "other_team-a", "other")] == [None] * 3


@pytest.mark.anyio
async def test_namespaces_have_separate_graphs(backends: Backends, graph: Graph, namespace: str) -> None:
    nodes, edges = parse_lines(jsonl(GOOD).splitlines())
    await upsert(graph, nodes, edges)
    window = Summary("working", False, (), 0.0, ("agent-a",), ("cluster:auth",), 1, 2)
    await write_anchor(graph, "cp-1", "s-1", window, datetime.now(UTC), cap=5)
    other = await Graphs(backends).get(namespace + "-other")
    try:
        assert await rows(other, "MATCH (n) RETURN count(n)") == [[0]]
        assert await rows(graph, "MATCH (n) RETURN count(n)") == [[5]]
        assert backends.graph_name(namespace) == f"memento_{namespace}"
    finally:
        await other.delete()


@pytest.mark.parametrize(("line", "field", "message"), [
    ('{"node": {"id": "x", "labels": ["Function"]}}', "node.labels.0", "Input should be 'CodebaseEntity'"),
    ('{"edge": {"from": "a", "to": "b", "type": "CALLS"}}', "edge.type", "Input should be 'MEMBER_OF_CLUSTER'"),
    ('{"edge": {"from": "a", "type": "TESTS"}}', "edge.to", "Field required"),
    ('{"node": {"id": "x", "props": {"meta": {"a": 1}}}}', "node.props", "property 'meta' must be a string"),
    ('{"node": {"id": "x", "props": {"gone": null}}}', "node.props", "property 'gone' must be a string"),
    ('{"node": {"id": "x", "props": {"id": "y"}}}', "node", "props may not set 'id'"),
    ('{"node": {"id": "x"}, "edge": {"from": "a", "to": "b", "type": "TESTS"}}', "record", "exactly one"),
    ('{"node": {"id": "x"}', "record", "Invalid JSON"),
    ('{"nodes": {"id": "x"}}', "nodes", "Extra inputs are not permitted"),
])
def test_bad_record_names_line_and_field(line: str, field: str, message: str) -> None:
    with pytest.raises(BadRecord) as bad:
        parse_lines([json.dumps(GOOD[0]), "", line, json.dumps(GOOD[1])])
    assert (bad.value.line, bad.value.field) == (3, field)
    assert str(bad.value).startswith(f"line 3: {field}: ")
    assert message in str(bad.value)


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, backend_urls: Endpoints, tmp_path: Path) -> Iterator[FalkorDB]:
    """The CLI's environment pointing at the test backends; yields a plain FalkorDB client to look with."""
    monkeypatch.setenv("MEMENTO_REDIS_URL", backend_urls.redis_url)
    monkeypatch.setenv("MEMENTO_POSTGRES_DSN", backend_urls.postgres_dsn or "off")
    monkeypatch.setenv("MEMENTO_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("MEMENTO_LOG_LEVEL", "warning")
    if (graphs := falkordb_url(backend_urls)) is not None:
        monkeypatch.setenv("MEMENTO_FALKORDB_URL", graphs)
    db = FalkorDB.from_url(graphs or backend_urls.redis_url)  # the graphs' server
    yield db
    db.connection.close()


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """Run `memento-sessions ARGS` as a user does, in its own process."""
    return subprocess.run([sys.executable, "-m", "memento_sessions.cli", *args], capture_output=True, text=True,
                          timeout=60, check=False)


def graphs_of(db: FalkorDB) -> set[str]:
    return {name.decode() if isinstance(name, bytes) else name for name in db.connection.execute_command("GRAPH.LIST")}


def test_kg_load_with_a_bad_line_3_reports_it_and_writes_nothing(cli_env: FalkorDB, tmp_path: Path,
                                                                  namespace: str) -> None:
    path = tmp_path / "kg.jsonl"
    path.write_text(jsonl([GOOD[0], GOOD[1], '{"node": {"id": "x", "labels": ["Function"]}}', GOOD[2]]))
    done = cli("kg", "load", str(path), "--namespace", namespace)
    assert done.returncode == 1
    err = done.stderr
    assert "line 3: node.labels.0: Input should be" in err and "nothing was written" in err
    assert f"memento_{namespace}" not in graphs_of(cli_env)
    with pytest.raises(BadRecord, match=r"^line 3: "):
        load_file(path)


def test_kg_load_writes_the_file_into_the_namespace_graph(cli_env: FalkorDB, tmp_path: Path, namespace: str) -> None:
    path = tmp_path / "kg.jsonl"
    path.write_text(jsonl(GOOD))
    done = cli("kg", "load", str(path), "--namespace", namespace)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"loaded 3 nodes and 3 edges into namespace {namespace}"
    graph = cli_env.select_graph(f"memento_{namespace}")
    try:
        assert graph.query("MATCH (n) RETURN count(n)").result_set == [[4]]
        assert graph.query("MATCH ()-[r]->() RETURN count(r)").result_set == [[3]]
    finally:
        graph.delete()


def test_kg_load_shows_progress_on_long_files(cli_env: FalkorDB, tmp_path: Path, namespace: str) -> None:
    path = tmp_path / "kg.jsonl"
    path.write_text(jsonl([{"node": {"id": f"fn-{i}"}} for i in range(1200)]))
    done = cli("kg", "load", str(path), "--namespace", namespace)
    assert done.returncode == 0, done.stderr
    err = done.stderr
    assert "kg load: 500/1200 records (41%)" in err and "kg load: 1200/1200 records (100%)" in err
    cli_env.select_graph(f"memento_{namespace}").delete()


def test_prune_command_prints_what_it_removed(cli_env: FalkorDB, settings: Settings, backend_urls: Endpoints,
                                              namespace: str) -> None:
    old_day = datetime.now(UTC) - timedelta(days=90)
    anyio.run(_old_data, settings, backend_urls, namespace, old_day)
    done = cli("prune")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert f"\n  {namespace}: 2\n" in out
    assert f"\n  {partition_name(old_day.date())}" in out
    assert cli_env.select_graph(f"memento_{namespace}").query(
        "MATCH (a:SessionAnchor) RETURN a.checkpointId").result_set == [["cp-new"]]
    cli_env.select_graph(f"memento_{namespace}").delete()


async def _old_data(settings: Settings, urls: Endpoints, namespace: str, old_day: datetime) -> None:
    async with open_backends(settings, urls.redis_url, urls.postgres_dsn) as backends:
        graph = await Graphs(backends).get(namespace)
        for name, day in (("cp-old-1", old_day), ("cp-old-2", old_day), ("cp-new", datetime.now(UTC))):
            window = Summary("broken", True, (), 0.0, ("agent-a",), ("svc.a", "svc.b"), 1, 2)
            await write_anchor(graph, name, "s-1", window, day, cap=5)
        await Snapshots(backends.postgres).store_snapshot(namespace, "s-1", f"cp-{uuid.uuid4()}", "broken", [],
                                                          old_day)
