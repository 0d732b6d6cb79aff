"""What a lease on an entity covers, read from the knowledge graph: one Cypher read per acquire.

A file covers the symbols it DEFINES, a cluster its members (MEMBER_OF_CLUSTER into it). The read is
made at acquire time, so the lease covers what the graph says then; a symbol added to the file later is
covered by leases acquired after it (docs/coordination.md says why there is no cache to keep correct).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from memento_sessions.kg.graph import Graph, Graphs

COVERED = """
UNWIND $ids AS id
MATCH (n:CodebaseEntity {id: id})
OPTIONAL MATCH (n)-[:DEFINES]->(s)
OPTIONAL MATCH (m)-[:MEMBER_OF_CLUSTER]->(n)
RETURN id, collect(DISTINCT s.id), collect(DISTINCT m.id)
"""
MAX_COVERED = 4096  # entities one lease covers at most (its own and their contents); the rest is not leased
NO_GRAPH_FOR = 1.0  # seconds a namespace found without a graph is taken to have none
MAX_REMEMBERED = 10_000  # namespaces remembered as graph-less (cleared past it: namespaces are client input)


class Coverage:
    """Reads what leased entities contain; a namespace without a graph is remembered as such for NO_GRAPH_FOR
    seconds, so acquires there do not ask FalkorDB whether it exists every time."""

    def __init__(self, graphs: Graphs | None) -> None:
        self.graphs = graphs
        self._none_until: dict[str, float] = {}

    async def covered(self, namespace: str, entity_ids: Sequence[str]) -> list[tuple[str, str]]:
        """(entityId, via) for each requested entity (via '') and each one it contains (via the container)."""
        if self.graphs is None or self._none_until.get(namespace, 0.0) > time.monotonic():
            return [(entity, "") for entity in entity_ids]
        graph = await self.graphs.existing(namespace)
        if graph is None:
            if len(self._none_until) >= MAX_REMEMBERED:
                self._none_until.clear()
            self._none_until[namespace] = time.monotonic() + NO_GRAPH_FOR
            return [(entity, "") for entity in entity_ids]
        return await read_covered(graph, entity_ids)


async def read_covered(graph: Graph, entity_ids: Sequence[str]) -> list[tuple[str, str]]:
    """The one Cypher read: each entity, then what it DEFINES and its cluster members, via it."""
    pairs: dict[str, str] = {entity: "" for entity in entity_ids}
    result = await graph.ro_query(COVERED, {"ids": list(entity_ids)})
    for container, symbols, members in result.result_set:
        for inner in (*symbols, *members):
            if inner is not None and len(pairs) < MAX_COVERED:
                pairs.setdefault(str(inner), str(container))
    return list(pairs.items())
