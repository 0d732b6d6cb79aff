"""A namespace's knowledge graph, with its indexes created once per graph per process.

`CodebaseEntity` is the base label of every KG node (clusters, specs and benchmarks hang on it too), so
one index on `CodebaseEntity.id` finds any node by id, and anchors attach to loaded nodes.

`Graphs.rows` reads a query's reply in FalkorDB's compact form with `scalar` below rather than with the
falkordb client's parser, which awaits a coroutine per value: a bridge transitions reply holds ~1,400
values (that parser took ~2 ms of it), and the lease coverage cache reads every containment edge (the
parser blocked the loop for 100-200 ms on a 10,000-entity graph). Such queries return only scalars, lists
and maps.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

import anyio
from falkordb.helpers import stringify_param_value
from redis.exceptions import ResponseError

from memento_sessions import keys
from memento_sessions.backends import Backends, translated

Label = Literal["CodebaseEntity", "SemanticCluster", "Spec", "Benchmark", "Test", "Symbol"]
Relationship = Literal["MEMBER_OF_CLUSTER", "IMPLEMENTS_CLUSTER", "PERFORMS_FOR", "IMPACTS", "DEFINES", "TESTS",
                       "REQUIRES"]
BASE_LABEL: Label = "CodebaseEntity"
LABELS: tuple[Label, ...] = get_args(Label)
RELATIONSHIPS: tuple[Relationship, ...] = get_args(Relationship)

# Labels cannot be parameters; these are built from the fixed schema above, never from input.
CREATE_ID_INDEX = {label: f"CREATE INDEX FOR (n:{label}) ON (n.id)" for label in LABELS}
CREATE_ANCHOR_INDEXES = (
    "CREATE INDEX FOR (a:SessionAnchor) ON (a.checkpointId)",
    "CREATE INDEX FOR (a:SessionAnchor) ON (a.timestamp)",
    "CREATE INDEX FOR (a:SessionAnchor) ON (a.sessionId)",
)
LIST_GRAPHS = "GRAPH.LIST"
# The entities within two relationships of the given ones, over every relationship between codebase entities
# (the schema's and any other a graph carries: calls, imports), each once per path, one step then two; anchors
# (SessionAnchor) are not codebase entities, so no path goes through one. Each half stops at `limit` rows.
NEIGHBOURS = """
UNWIND $ids AS id
MATCH (n:CodebaseEntity {{id: id}})-[r]-(m:CodebaseEntity)
RETURN id AS start, type(r) AS r1, id(startNode(r)) = id(n) AS out1, m.id AS mid, null AS r2, null AS out2,
       null AS end
LIMIT {limit}
UNION ALL
UNWIND $ids AS id
MATCH (n:CodebaseEntity {{id: id}})-[r]-(a:CodebaseEntity)-[s]-(m:CodebaseEntity)
WHERE id(m) <> id(n)
RETURN id AS start, type(r) AS r1, id(startNode(r)) = id(n) AS out1, a.id AS mid, type(s) AS r2,
       id(startNode(s)) = id(a) AS out2, m.id AS end
LIMIT {limit}
"""
Row = list[Any]


class Graph:
    """A namespace's FalkorDB graph whose driver errors surface as BackendUnavailable("falkordb: ...")."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner  # falkordb.asyncio.AsyncGraph; the falkordb package ships no type information
        self.name: str = inner.name

    async def query(self, query: str, params: dict[str, Any] | None = None) -> Any:
        """Run a Cypher statement."""
        with translated("falkordb"):
            return await self._inner.query(query, params)

    async def ro_query(self, query: str, params: dict[str, Any] | None = None) -> Any:
        """Run a read-only Cypher statement."""
        with translated("falkordb"):
            return await self._inner.ro_query(query, params)

    async def delete(self) -> None:
        """Delete the whole graph."""
        with translated("falkordb"):
            await self._inner.delete()


async def ensure_indexes(graph: Graph) -> None:
    """Create every index the daemon's queries use; an index that exists already is fine."""
    for statement in (*CREATE_ID_INDEX.values(), *CREATE_ANCHOR_INDEXES):
        try:
            await graph.query(statement)
        except ResponseError as exc:
            if "already indexed" not in str(exc):
                raise


class Graphs:
    """Hands out namespace graphs, ensuring each one's indexes on first use (once per graph per instance)."""

    def __init__(self, backends: Backends) -> None:
        self.backends = backends
        self._ready: dict[str, Graph] = {}
        self._lock = anyio.Lock()

    async def get(self, namespace: str) -> Graph:
        """The graph of `namespace`, indexed (created by its first index when it did not exist)."""
        name = self.backends.graph_name(namespace)
        graph = self._ready.get(name)
        if graph is None:
            async with self._lock:
                graph = self._ready.get(name)
                if graph is None:
                    graph = Graph(self.backends.falkordb.select_graph(name))
                    await ensure_indexes(graph)
                    self._ready[name] = graph
        return graph

    async def existing(self, namespace: str) -> Graph | None:
        """The graph of `namespace` if it exists, indexed; None otherwise (a read never creates a graph)."""
        name = self.backends.graph_name(namespace)
        if name in self._ready:
            return self._ready[name]
        with translated("falkordb"):
            found = await self.backends.falkordb.connection.exists(name)
        return await self.get(namespace) if found else None

    async def namespaces(self) -> list[str]:
        """The namespaces that have a graph under this daemon's prefix (keys.graph_namespace)."""
        with translated("falkordb"):
            listed = await self.backends.falkordb.connection.execute_command(LIST_GRAPHS)
        names = (name.decode() if isinstance(name, bytes) else str(name) for name in listed)
        prefix = self.backends.graph_prefix
        return sorted({ns for name in names if (ns := keys.graph_namespace(prefix, name)) is not None})

    def forget(self, namespace: str) -> None:
        """The graph was deleted: index it again if it comes back."""
        self._ready.pop(self.backends.graph_name(namespace), None)

    async def rows(self, namespace: str, query: str, params: dict[str, Any]) -> list[Row]:
        """The rows of a read-only query on the namespace's graph; none when it has no graph (yet)."""
        graph = await self.existing(namespace)
        if graph is None:
            return []
        text = f"CYPHER {' '.join(f'{key}={stringify_param_value(value)}' for key, value in params.items())} " \
            f"{query}" if params else query
        try:
            with translated("falkordb"):
                reply = await self.backends.falkordb.connection.execute_command(
                    "GRAPH.RO_QUERY", graph.name, text, "--compact")
        except ResponseError as exc:
            if "empty key" not in str(exc):
                raise
            self.forget(namespace)  # the graph was deleted since we indexed it
            return []
        if len(reply) < 3:  # a reply without columns is its statistics alone
            return []
        return [[scalar(cell) for cell in row] for row in reply[1]]


Neighbour = tuple[str, int, str]
ROWS_PER_ENTITY = 4  # rows (paths) read per entity `neighbours` may return, in each of its two halves


async def neighbours(graphs: Graphs, namespace: str, entity_ids: list[str], limit: int) -> tuple[list[Neighbour], bool]:
    """(entity, depth, path) for each entity one or two relationships from `entity_ids` (the nearest path
    first, each entity once; the named ones left out), at most `limit` of them, and whether some may have been
    left out; a path reads like `file:a.py -[DEFINES]-> sym:a.py:f <-[TESTS]- test:t`."""
    cap = limit * ROWS_PER_ENTITY
    rows = await graphs.rows(namespace, NEIGHBOURS.format(limit=cap), {"ids": entity_ids})
    found: dict[str, tuple[str, int, str]] = {}
    for start, r1, out1, mid, r2, out2, end in sorted(rows, key=lambda row: row[6] is not None):
        path = f"{start} {step(r1, out1)} {mid}"
        target, depth = (mid, 1) if end is None else (end, 2)
        if end is not None:
            path += f" {step(r2, out2)} {end}"
        if target not in entity_ids and target not in found and len(found) < limit:
            found[target] = (str(target), depth, path)
    deep = sum(1 for row in rows if row[6] is not None)
    return list(found.values()), len(found) >= limit or deep >= cap or len(rows) - deep >= cap


def step(relationship: str, outgoing: bool) -> str:
    return f"-[{relationship}]->" if outgoing else f"<-[{relationship}]-"


def scalar(cell: list[Any]) -> Any:
    """One compact `[type, value]` cell as Python: null, string, integer, boolean, double, array or map."""
    kind, value = cell
    if kind == _STRING:
        return value
    if kind == _ARRAY:
        return [scalar(item) for item in value]
    if kind in _PLAIN:
        return _PLAIN[kind](value)
    if kind == _MAP:
        return {value[i]: scalar(value[i + 1]) for i in range(0, len(value), 2)}
    raise ValueError(f"a graph query returned a value of compact type {kind}; only scalars, lists and maps "
                     "are read")


_STRING, _ARRAY, _MAP = 2, 6, 10
_PLAIN: dict[int, Any] = {1: lambda _: None, 3: int, 4: lambda v: v == "true", 5: float}

