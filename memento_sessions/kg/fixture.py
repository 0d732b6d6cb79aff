"""A deterministic codebase graph of any size, for tests and benchmarks, as the JSON Lines `kg load` reads.

    python -m memento_sessions.kg.fixture --entities 10000 > kg.jsonl
    memento-sessions kg load kg.jsonl

The shape follows a real service codebase: every entity (a function) is a member of one semantic
cluster; clusters implement specs, specs require earlier specs; a few entities impact a spec directly;
benchmarks measure a cluster and its hot-path entities; tests cover one or two entities; every entity
defines one to three symbols. The same size and seed always give the same lines.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

AREAS = ("auth", "billing", "search", "payments", "notify", "storage", "gateway", "scheduler", "reports",
         "profile", "catalog", "cart", "audit", "sync", "export", "metrics")
TOPICS = ("session handling", "token refresh", "rate limiting", "caching", "retries", "validation",
          "serialization", "pagination", "webhooks", "permissions", "indexing", "migrations")
VERBS = ("get", "load", "save", "parse", "build", "check", "render", "fetch", "merge", "apply", "resolve", "emit")
NOUNS = ("token", "user", "invoice", "query", "page", "order", "event", "batch", "record", "policy", "index")
Record = dict[str, Any]


@dataclass
class Cluster:
    """One semantic cluster, its specs and its member entities."""

    id: str
    area: str
    specs: list[str] = field(default_factory=list)
    members: list[str] = field(default_factory=list)


def node(node_id: str, label: str, **props: Any) -> Record:
    """A node line."""
    return {"node": {"id": node_id, "labels": [label], "props": props}}


def edge(src: str, dst: str, rel: str) -> Record:
    """An edge line."""
    return {"edge": {"from": src, "to": dst, "type": rel, "props": {}}}


def generate(entities: int, seed: int = 7) -> Iterator[Record]:
    """Every node line, then every edge line, of a graph with `entities` CodebaseEntity nodes."""
    rng = random.Random(seed)
    clusters = _clusters(max(1, entities // 100))
    nodes: list[Record] = []
    edges: list[Record] = []
    _specs(rng, clusters, nodes, edges)
    _entities(rng, clusters, entities, nodes, edges)
    _benchmarks(rng, clusters, max(1, entities // 50), nodes, edges)
    _tests(rng, clusters, max(1, entities // 2), nodes, edges)
    yield from nodes
    yield from edges


def _clusters(count: int) -> list[Cluster]:
    return [Cluster(f"cluster:{AREAS[i % len(AREAS)]}-{i:03d}", AREAS[i % len(AREAS)]) for i in range(count)]


def _specs(rng: random.Random, clusters: Sequence[Cluster], nodes: list[Record], edges: list[Record]) -> None:
    """Each cluster implements one or two specs; a spec may require the spec before it."""
    previous: str | None = None
    for cluster in clusters:
        topic = rng.choice(TOPICS)
        nodes.append(node(cluster.id, "SemanticCluster", name=f"{cluster.area}: {topic}", area=cluster.area))
        for k in range(rng.choice((1, 1, 2))):
            spec = f"spec:{cluster.id.removeprefix('cluster:')}-{k}"
            nodes.append(node(spec, "Spec", title=f"{cluster.area.title()} {topic} v{k + 1}",
                              status=rng.choice(("draft", "accepted", "accepted", "implemented"))))
            edges.append(edge(cluster.id, spec, "IMPLEMENTS_CLUSTER"))
            if previous is not None and rng.random() < 0.3:
                edges.append(edge(spec, previous, "REQUIRES"))
            cluster.specs.append(spec)
            previous = spec


def _entities(rng: random.Random, clusters: Sequence[Cluster], count: int, nodes: list[Record],
              edges: list[Record]) -> None:
    """Functions spread over the clusters, each with its symbols; one in ten impacts a spec."""
    for i in range(count):
        cluster = clusters[i % len(clusters)]
        name = f"{rng.choice(VERBS)}_{rng.choice(NOUNS)}_{i}"
        module = f"src/{cluster.area}/{rng.choice(NOUNS)}_{i // 40}.py"
        entity = f"{module}::{name}"
        nodes.append(node(entity, "CodebaseEntity", name=name, path=module, elementType="function",
                          language="python"))
        edges.append(edge(entity, cluster.id, "MEMBER_OF_CLUSTER"))
        cluster.members.append(entity)
        for k in range(rng.randint(1, 3)):
            symbol = f"sym:{entity}#{k}"
            nodes.append(node(symbol, "Symbol", name=f"{name}_{k}" if k else name,
                              kind=rng.choice(("function", "class", "constant"))))
            edges.append(edge(entity, symbol, "DEFINES"))
        if rng.random() < 0.1:
            edges.append(edge(entity, rng.choice(cluster.specs), "IMPACTS"))


def _benchmarks(rng: random.Random, clusters: Sequence[Cluster], count: int, nodes: list[Record],
                edges: list[Record]) -> None:
    """Each benchmark measures one cluster and up to three of its hot-path entities."""
    for i in range(count):
        cluster = clusters[i % len(clusters)]
        bench = f"bench:{cluster.area}-{i:04d}"
        nodes.append(node(bench, "Benchmark", name=f"{cluster.area} p99 #{i}", unit="ms",
                          perfDelta=round(rng.uniform(-20.0, 20.0), 1)))
        edges.append(edge(bench, cluster.id, "PERFORMS_FOR"))
        for entity in rng.sample(cluster.members, min(3, len(cluster.members))):
            edges.append(edge(bench, entity, "PERFORMS_FOR"))


def _tests(rng: random.Random, clusters: Sequence[Cluster], count: int, nodes: list[Record],
           edges: list[Record]) -> None:
    """Unit tests cover one entity, integration tests two of the same cluster."""
    for i in range(count):
        cluster = clusters[i % len(clusters)]
        kind = "integration" if rng.random() < 0.25 else "unit"
        test = f"test:{cluster.area}/test_{i:05d}"
        nodes.append(node(test, "Test", name=f"test_{cluster.area}_{i}", kind=kind))
        for entity in rng.sample(cluster.members, min(2 if kind == "integration" else 1, len(cluster.members))):
            edges.append(edge(test, entity, "TESTS"))


def main(argv: Sequence[str] | None = None) -> int:
    """Write the graph's JSON Lines to stdout."""
    parser = argparse.ArgumentParser(prog="python -m memento_sessions.kg.fixture",
                                     description="Write a deterministic codebase graph as JSON Lines.")
    parser.add_argument("--entities", type=int, default=1000, help="CodebaseEntity nodes (default 1000)")
    parser.add_argument("--seed", type=int, default=7, help="random seed (default 7)")
    args = parser.parse_args(argv)
    if args.entities < 1:
        parser.error("--entities must be at least 1")
    out = sys.stdout
    for record in generate(args.entities, args.seed):
        out.write(json.dumps(record, separators=(",", ":")) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
