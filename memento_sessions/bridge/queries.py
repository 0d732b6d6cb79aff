"""Every Cypher statement of the SessionBridge, parameterised, with the shape of its rows.

Each query takes a batch of ids (UNWIND) so one bridge call costs one graph round trip, and returns
scalars, lists and maps, never nodes: the client then needs no schema look-ups to decode a reply.
Hops over several relationship types are written `*0..1`: FalkorDB then walks the adjacency lists,
where it plans a plain one-hop pattern over several types as a far slower algebraic traversal.
"""

from __future__ import annotations

# $ids -> [[entityId], specTitles, clusterNames, [[benchmarkId, perfDelta]]]: what lies within two hops of
# the entities (themselves included when they are specs, clusters or benchmarks: a spec asked about is its own context).
# Two one-hop steps with the first hop's nodes made distinct: entities of one cluster share the second
# hop through it, where one two-hop traversal per entity walks every member of its cluster again.
# The second hop leaves MEMBER_OF_CLUSTER out: from a cluster it leads only to member entities, which are
# never a Spec, cluster or Benchmark, and walking every member of every cluster was two thirds of the
# query's time (4.9 ms -> 1.6 ms server-side for 100 ids on the 10,000-entity fixture, same rows).
TRANSITION_CONTEXT = """
UNWIND $ids AS id
MATCH (e:CodebaseEntity {id: id})-[:IMPACTS|IMPLEMENTS_CLUSTER|PERFORMS_FOR|MEMBER_OF_CLUSTER*0..1]-(h)
WITH h, collect(DISTINCT e.id) AS entityIds
MATCH (h)-[:IMPACTS|IMPLEMENTS_CLUSTER|PERFORMS_FOR*0..1]-(r)
WHERE r:Spec OR r:SemanticCluster OR r:Benchmark
WITH entityIds, collect(DISTINCT r) AS rs
RETURN entityIds,
       [r IN rs WHERE r:Spec | r.title],
       [r IN rs WHERE r:SemanticCluster | r.name],
       [r IN rs WHERE r:Benchmark | [r.id, r.perfDelta]]
"""

# $ids -> [entityId, related, newest anchor's properties or null]; related rows are
# [label, relationship, id, name, perfDelta] of the entity's Symbol, Test and Benchmark neighbours.
# Every node also carries the base label CodebaseEntity (kg/loader.py), so the kind is named explicitly.
HANDOFF_CONTEXT = """
UNWIND $ids AS id
MATCH (e:CodebaseEntity {id: id})
OPTIONAL MATCH p = (e)-[:DEFINES|TESTS|PERFORMS_FOR*0..1]-(n)
WHERE n <> e AND (n:Symbol OR n:Test OR n:Benchmark)
WITH e, collect([CASE WHEN n:Symbol THEN 'Symbol' WHEN n:Test THEN 'Test' ELSE 'Benchmark' END,
                 type(relationships(p)[0]), n.id, n.name, n.perfDelta]) AS related
OPTIONAL MATCH (e)<-[:ANCHORS]-(a:SessionAnchor)
WITH e, related, a ORDER BY a.timestamp DESC, a.checkpointId DESC
WITH e, related, head(collect(a)) AS last
RETURN e.id, related, CASE WHEN last IS NULL THEN null ELSE properties(last) END
"""

# $sessionId -> [anchor properties, [entityId]]: every anchor a session left, for isolate and the archive.
SESSION_ANCHORS = """
MATCH (a:SessionAnchor {sessionId: $sessionId})
RETURN properties(a), [(a)-[:ANCHORS]->(e:CodebaseEntity) | e.id]
"""

# $clusterId, $sinceIso, $sinceMs -> [name, specTitles, [[entityId, anchor properties]]].
# Anchors stamped either as ISO-8601 text or as epoch milliseconds are both compared correctly:
# comparing a string with a number yields null, so exactly one side of the OR can hold.
CLUSTER_OUTCOMES = """
MATCH (c:SemanticCluster {id: $clusterId})
OPTIONAL MATCH (c)-[:IMPLEMENTS_CLUSTER]-(s:Spec)
WITH c, collect(DISTINCT s.title) AS titles
OPTIONAL MATCH (c)-[:MEMBER_OF_CLUSTER]-(e:CodebaseEntity)<-[:ANCHORS]-(a:SessionAnchor)
WHERE a.timestamp >= $sinceIso OR a.timestamp >= $sinceMs
RETURN c.name, titles, collect([e.id, properties(a)])
"""
