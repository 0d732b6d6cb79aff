"""Checkpoint anchors on the knowledge graph: `(:SessionAnchor)-[:ANCHORS]->(:CodebaseEntity)`.

One query writes an anchor on a chunk of at most `chunk` entities and trims each of them to its newest
`cap` anchors; a checkpoint naming more entities runs one such query per chunk. FalkorDB runs a graph's
writes one at a time and holds its server's one thread for each query: the chunks bound that hold, and
every other client of the server gets in between two of them. Each query merges by checkpointId, so two
daemons writing the same checkpoint (or a retry after a failed chunk) leave one anchor with one link per
entity. See docs/checkpoints.md.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from memento_sessions.checkpoints.aggregate import Summary
from memento_sessions.kg.graph import Graph
from memento_sessions.metrics import KG_STUBS_PRUNED

PRUNE_BATCH = 1000

# The trim computes `orphan` before deleting and filters only after an aggregation: FalkorDB 4.16
# pushes a WHERE placed after a DELETE below it, which would skip the deletes it should follow.
WRITE_ANCHOR = """
MERGE (a:SessionAnchor {checkpointId: $checkpointId})
ON CREATE SET a += $props
WITH a
UNWIND $entityIds AS id
MERGE (e:CodebaseEntity {id: id})
ON CREATE SET e.stub = true
MERGE (a)-[:ANCHORS]->(e)
WITH DISTINCT e
MATCH (e)<-[:ANCHORS]-(x:SessionAnchor)
WITH e, x ORDER BY x.timestamp DESC, x.checkpointId DESC
WITH e, collect(x)[$cap..] AS older
UNWIND older AS x
WITH x, collect(e) AS dropped
WITH x, dropped, size(dropped) = size([(x)-[:ANCHORS]->(y) | y]) AS orphan
UNWIND dropped AS e
MATCH (x)-[r:ANCHORS]->(e)
DELETE r
WITH collect(DISTINCT CASE WHEN orphan THEN x END) AS orphans
UNWIND orphans AS x
DELETE x
RETURN count(x)
"""

PRUNE_ANCHORS = """
MATCH (a:SessionAnchor) WHERE a.timestamp < $cutoff
WITH a LIMIT $batch
DETACH DELETE a
RETURN count(a)
"""


# A stub is a bare entity a checkpoint named before the KG knew it. Once no anchor points at it (and
# nothing else links it: an edge loaded by kg.upsert keeps its stub ends) it is removed.
PRUNE_STUBS = """
MATCH (e:CodebaseEntity) WHERE e.stub = true
WITH e, size([(e)-[]-(x) | x]) AS links
WHERE links = 0
WITH e LIMIT $batch
DELETE e
RETURN count(e)
"""


def epoch_ms(moment: datetime) -> int:
    """Anchor timestamps are UTC epoch milliseconds: ordered, range-indexed, language-neutral."""
    return int(moment.timestamp() * 1000)


def anchor_props(session_id: str, summary: Summary, timestamp: datetime, external_ref: str | None) -> dict[str, Any]:
    """The anchor's properties: scalars and arrays of scalars only (FalkorDB stores no maps)."""
    props: dict[str, Any] = {
        "sessionId": session_id, "outcome": summary.outcome, "brokeDuring": summary.broke_during,
        "keyImpacts": list(summary.key_impacts), "perfDelta": summary.perf_delta, "actors": list(summary.actors),
        "timestamp": epoch_ms(timestamp), "fromSeq": summary.from_seq, "toSeq": summary.to_seq,
    }
    if external_ref is not None:
        props["externalRef"] = external_ref
    return props


async def write_anchor(graph: Graph, checkpoint_id: str, session_id: str, summary: Summary,
                       timestamp: datetime, cap: int, external_ref: str | None = None, chunk: int = 256) -> int:
    """Anchor the checkpoint on each entity of `summary`, `chunk` entities per query, and keep the newest `cap`
    anchors per entity; links created."""
    props = anchor_props(session_id, summary, timestamp, external_ref)
    created = 0
    for start in range(0, len(summary.entity_ids), chunk):  # no entity: no anchor (it could never be found)
        result = await graph.query(WRITE_ANCHOR, {
            "checkpointId": checkpoint_id, "entityIds": list(summary.entity_ids[start:start + chunk]), "cap": cap,
            "props": props,
        })
        created += int(result.relationships_created)
    return created


async def prune_anchors(graph: Graph, older_than: timedelta, now: datetime | None = None) -> int:
    """Delete anchors older than `older_than`, then the stubs only they pointed at; anchors removed."""
    anchors, _ = await prune_graph(graph, older_than, now)
    return anchors


async def prune_graph(graph: Graph, older_than: timedelta, now: datetime | None = None) -> tuple[int, int]:
    """Delete anchors older than `older_than`, then every stub no anchor points at; (anchors, stubs) removed."""
    cutoff = epoch_ms((now or datetime.now(UTC)) - older_than)
    anchors = await _in_batches(graph, PRUNE_ANCHORS, {"cutoff": cutoff})
    return anchors, await prune_stubs(graph)


async def prune_stubs(graph: Graph) -> int:
    """Delete stub entities no anchor (and nothing else) links; how many."""
    removed = await _in_batches(graph, PRUNE_STUBS, {})
    KG_STUBS_PRUNED.inc(removed)
    return removed


async def _in_batches(graph: Graph, query: str, params: dict[str, Any]) -> int:
    """Run a deleting query PRUNE_BATCH at a time, so no one query holds the graph long; rows deleted."""
    removed = 0
    while True:
        result = await graph.query(query, {**params, "batch": PRUNE_BATCH})
        deleted = int(result.result_set[0][0])
        removed += deleted
        if deleted < PRUNE_BATCH:
            return removed
