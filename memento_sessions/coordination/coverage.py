"""What a lease on an entity covers, read from the knowledge graph: one Cypher read per acquire.

A file covers the symbols it DEFINES, a cluster its members (MEMBER_OF_CLUSTER into it). The read is
made at acquire time, so the lease covers what the graph says then; a symbol added to the file later is
covered by leases acquired after it (docs/coordination.md says why there is no cache to keep correct).
"""

from __future__ import annotations

from collections.abc import Sequence

from memento_sessions.kg.graph import Graphs

COVERED = """
UNWIND $ids AS id
MATCH (n:CodebaseEntity {id: id})
OPTIONAL MATCH (n)-[:DEFINES]->(s)
OPTIONAL MATCH (m)-[:MEMBER_OF_CLUSTER]->(n)
RETURN id, collect(DISTINCT s.id), collect(DISTINCT m.id)
"""
MAX_COVERED = 4096  # entities one lease covers at most (its own and their contents); the rest is not leased


async def covered(graphs: Graphs | None, namespace: str, entity_ids: Sequence[str]) -> list[tuple[str, str]]:
    """(entityId, via) for each requested entity (via '') and each one it contains (via the container)."""
    pairs: dict[str, str] = {entity: "" for entity in entity_ids}
    graph = await graphs.existing(namespace) if graphs is not None else None
    if graph is None:
        return list(pairs.items())
    result = await graph.ro_query(COVERED, {"ids": list(entity_ids)})
    for container, symbols, members in result.result_set:
        for inner in (*symbols, *members):
            if inner is not None and len(pairs) < MAX_COVERED:
                pairs.setdefault(str(inner), str(container))
    return list(pairs.items())
