"""What a lease on an entity covers, from the knowledge graph: a cache of the namespace's containment edges,
kept correct by a graph version that the grant itself checks.

A file covers the symbols it DEFINES, a cluster its members (MEMBER_OF_CLUSTER into it). Rather than one
Cypher read per acquire (a second round trip, to FalkorDB, on every grant), each daemon keeps every
containment edge of a namespace in memory, loaded by one read and stamped with the namespace's graph
version: a random token in the coordination slot that every graph write through the daemon (the `kg.*`
write methods, on any daemon) replaces after writing. `mc_acquire` compares the version the coverage was
computed at with the current one in the same call as the grant; on a mismatch it grants nothing and the
daemon reloads and retries. So a grant never uses containment older than the last write through the
daemon. Writes that bypass every daemon (the CLI's `kg load` writes FalkorDB directly) are picked up when a
cache is MAX_AGE old: the lease reaper's loop reloads the caches used lately once they are that old, so no
acquire waits for that reload (on a 10,000-entity graph FalkorDB takes 100 to 200 ms over the edges; their
rows are read in compact form by `Graphs.rows`, not the falkordb package's per-cell Python parser, which
blocked the event loop for as long again). A cache twice MAX_AGE old (no reaper) is reloaded by the acquire.
The caches of all namespaces together hold at most MEMENTO_LEASE_COVERAGE_EDGES edges (namespaces are client
input): loading one past it first forgets the least recently used others, and a namespace with more edges
than that alone is not cached: its acquires read their own entities' contents (the per-acquire read, the
same answer).

The cache also answers the other way (`containers`): the files that define an entity and the clusters it is a
member of. A grant checks the holds on those too, without holding them, so a lease on a file covers a symbol
the graph added to it after the lease was granted.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import anyio

from memento_sessions import keys
from memento_sessions.coordination.store import CoordStore
from memento_sessions.kg.graph import Graph, Graphs

COVERED = """
UNWIND $ids AS id
MATCH (n:CodebaseEntity {id: id})
OPTIONAL MATCH (n)-[:DEFINES]->(s)
OPTIONAL MATCH (m)-[:MEMBER_OF_CLUSTER]->(n)
RETURN id, collect(DISTINCT s.id), collect(DISTINCT m.id)
"""
CONTAINERS = """
UNWIND $ids AS id
MATCH (n:CodebaseEntity {id: id})
OPTIONAL MATCH (f)-[:DEFINES]->(n)
OPTIONAL MATCH (n)-[:MEMBER_OF_CLUSTER]->(c)
RETURN id, collect(DISTINCT f.id), collect(DISTINCT c.id)
"""
CONTAINS = """
MATCH (n:CodebaseEntity)-[:DEFINES]->(s) RETURN n.id AS outer, s.id AS inner LIMIT {limit}
UNION ALL
MATCH (m)-[:MEMBER_OF_CLUSTER]->(n:CodebaseEntity) RETURN n.id AS outer, m.id AS inner LIMIT {limit}
"""
MAX_AGE = 60.0  # seconds a cache serves before it is reloaded (writes that bypass the daemon)
MAX_NAMESPACES = 1000  # namespaces cached at once (cleared past it: namespaces are client input)
NO_GRAPH = "*"  # the version passed when no graph can exist (no FalkorDB): the grant checks none
Pairs = list[tuple[str, str]]


@dataclass(frozen=True)
class Contents:
    """A namespace's containment at one graph version: container -> contained (None: too big to cache)."""

    version: str
    inner: dict[str, list[str]] | None
    until: float  # reloaded from here on (by the reaper's loop; by an acquire only MAX_AGE later)
    edges: int = 0  # what it counts against the daemon's MEMENTO_LEASE_COVERAGE_EDGES
    outer: dict[str, list[str]] | None = None  # contained -> its containers (the same edges, the other way)


class Coverage:
    """Expands leased entities to what they contain, from a per-namespace cache checked at grant time."""

    def __init__(self, graphs: Graphs | None, store: CoordStore, max_edges: int, max_covered: int) -> None:
        self.graphs = graphs
        self.store = store
        self.max_edges = max_edges  # every namespace's cache together
        self.max_covered = max_covered  # pairs one expansion returns at most beyond this one (the caller refuses)
        self._cache: dict[str, Contents] = {}  # least recently used first
        self.edges = 0  # held by the caches now
        self._locks: dict[str, anyio.Lock] = {}
        self._used: set[str] = set()  # namespaces acquired in since their cache was last refreshed

    async def covered(self, namespace: str, entity_ids: Sequence[str]) -> tuple[str, Pairs]:
        """The graph version, and (entityId, via) for each requested entity (via '') and each one it contains
        (via the container). No call at all when the namespace's cache is fresh."""
        if self.graphs is None:
            return NO_GRAPH, [(entity, "") for entity in entity_ids]
        contents = self._cache.pop(namespace, None)
        if contents is not None:
            self._cache[namespace] = contents  # now the most recently used
        if contents is None or contents.until + MAX_AGE <= time.monotonic():
            contents = await self.reload(namespace, None)
        self._used.add(namespace)
        if contents.inner is None:
            return contents.version, await self.read(namespace, entity_ids)
        return contents.version, expand(entity_ids, contents.inner, self.max_covered)

    async def containers(self, namespace: str, version: str, pairs: Pairs) -> Pairs:
        """(container, entity) for each covered entity's containers that the pairs do not hold themselves: a
        lease on a container holds what the graph added to it after its grant, so the grant checks them too.
        From the cache when it is at `version`, else (NO_GRAPH: the grant checks no version) one Cypher read;
        none without a graph."""
        if self.graphs is None:
            return []
        held = {entity for entity, _ in pairs}
        contents = self._cache.get(namespace)
        if contents is not None and contents.version == version and contents.outer is not None:
            found = [(outer, entity) for entity in held for outer in contents.outer.get(entity, ())]
        else:
            found = await self._read_containers(namespace, list(held))
        return [(outer, entity) for outer, entity in found if outer not in held][:self.max_covered + 1]

    async def _read_containers(self, namespace: str, entity_ids: list[str]) -> Pairs:
        graph = await self.graphs.existing(namespace) if self.graphs is not None else None
        if graph is None:
            return []
        result = await graph.ro_query(CONTAINERS, {"ids": entity_ids})
        return [(str(outer), str(entity)) for entity, files, clusters in result.result_set
                for outer in (*files, *clusters) if outer is not None]

    async def reload(self, namespace: str, stale: str | None) -> Contents:
        """Load the namespace's containment at its current version (once, however many acquires wait for it);
        `stale` names a version the grant refused, which a concurrent load may already have replaced."""
        lock = self._locks.setdefault(namespace, anyio.Lock())
        async with lock:
            current = self._cache.get(namespace)
            if current is not None and current.version != stale and current.until > time.monotonic():
                return current
            version = await self.store.command("HGET", keys.lease_keys(namespace).fence, GRAPH_FIELD) or ""
            inner, edges = await self._load(namespace)
            contents = Contents(str(version), inner, time.monotonic() + MAX_AGE, edges, reverse(inner))
            self._forget(namespace)
            if len(self._cache) >= MAX_NAMESPACES:
                self._cache.clear()
                self._used.clear()
                self._locks = {namespace: lock}
                self.edges = 0
            while self._cache and self.edges + edges > self.max_edges:  # the least recently used go first
                self._forget(next(iter(self._cache)))
            self._cache[namespace] = contents
            self.edges += edges
            return contents

    def _forget(self, namespace: str) -> None:
        contents = self._cache.pop(namespace, None)
        if contents is not None:
            self.edges -= contents.edges
            self._used.discard(namespace)

    async def refresh(self) -> None:
        """Reload each cache that is MAX_AGE old and was used since it was loaded; drop the unused ones."""
        now = time.monotonic()
        for namespace, contents in list(self._cache.items()):
            if contents.until > now:
                continue
            if namespace in self._used:
                self._used.discard(namespace)
                await self.reload(namespace, None)
            else:
                self._forget(namespace)

    async def _load(self, namespace: str) -> tuple[dict[str, list[str]] | None, int]:
        """The namespace's containment and its edge count; None (counting 0) when it has more edges than
        every cache together may hold."""
        assert self.graphs is not None
        rows = await self.graphs.rows(namespace, CONTAINS.format(limit=self.max_edges + 1), {})  # none: no graph
        if len(rows) > self.max_edges:
            return None, 0
        inner: dict[str, list[str]] = {}
        for outer, contained in rows:
            if contained is not None:
                inner.setdefault(str(outer), []).append(str(contained))
        return inner, len(rows)

    async def read(self, namespace: str, entity_ids: Sequence[str]) -> Pairs:
        """The entities' contents read from the graph now (no cache)."""
        assert self.graphs is not None
        graph = await self.graphs.existing(namespace)
        if graph is None:
            return [(entity, "") for entity in entity_ids]
        return await read_covered(graph, entity_ids, self.max_covered)

    async def changed(self, namespace: str) -> None:
        """The namespace's graph was written: a new version, so every daemon's grants refuse their cache."""
        await self.store.call("mc_graph_changed", [keys.lease_keys(namespace).fence], uuid.uuid4().hex)


GRAPH_FIELD = "\x01graph"  # the fence hash's field holding the graph version (entity ids hold no control chars)


def reverse(inner: dict[str, list[str]] | None) -> dict[str, list[str]] | None:
    """contained -> its containers, from container -> contained."""
    if inner is None:
        return None
    outer: dict[str, list[str]] = {}
    for container, contained in inner.items():
        for entity in contained:
            outer.setdefault(entity, []).append(container)
    return outer


def expand(entity_ids: Sequence[str], inner: dict[str, list[str]], cap: int) -> Pairs:
    """Each entity (via ''), then what each contains (via it), the first container winning; it stops past
    `cap` pairs (one more than the cap says the lease would cover too much)."""
    pairs: dict[str, str] = {entity: "" for entity in entity_ids}
    for container in entity_ids:
        for contained in inner.get(container, ()):
            if len(pairs) > cap:
                return list(pairs.items())
            pairs.setdefault(contained, container)
    return list(pairs.items())


async def read_covered(graph: Graph, entity_ids: Sequence[str], cap: int) -> Pairs:
    """The per-acquire Cypher read: each entity, then what it DEFINES and its cluster members, via it; like
    `expand`, it stops past `cap` pairs."""
    pairs: dict[str, str] = {entity: "" for entity in entity_ids}
    result = await graph.ro_query(COVERED, {"ids": list(entity_ids)})
    for container, symbols, members in result.result_set:
        for inner in (*symbols, *members):
            if inner is not None and len(pairs) <= cap:
                pairs.setdefault(str(inner), str(container))
    return list(pairs.items())
