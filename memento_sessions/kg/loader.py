"""Loading KG nodes and edges: the JSON Lines `kg load` reads, validated whole before anything is written.

`{"node": {"id", "labels", "props"}}` or `{"edge": {"from", "to", "type", "props"}}`, one a line.
Every node gets the base label CodebaseEntity besides its own; an edge to an id never loaded
creates a stub, as an anchor does.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)

from memento_sessions.errors import BadRecord as BadRecord  # defined in errors; name kept for importers
from memento_sessions.kg.graph import BASE_LABEL, LABELS, RELATIONSHIPS, Graph, Label, Relationship
from memento_sessions.sessions.checks import value_problem
from memento_sessions.sessions.models import (
    EntityId,  # the one entity id: checked in pydantic-core, not per id in Python
)

BATCH = 500
MAX_RECORDS = 10_000  # per kg.upsert call; files are loaded in batches and have no limit

PropName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")]
SCALARS = (bool, int, float, str)
Progress = Callable[[int, int], None]

MERGE_NODES = """
UNWIND $rows AS row
MERGE (n:CodebaseEntity {id: row.id})
SET n += row.props, n.stub = null
"""
# Labels and relationship types cannot be parameters; each statement is built from the fixed schema.
ADD_LABEL = {
    label: f"UNWIND $ids AS id MATCH (n:CodebaseEntity {{id: id}}) SET n:{label}"
    for label in LABELS if label != BASE_LABEL
}
MERGE_EDGES = {rel: f"""
UNWIND $rows AS row
MERGE (a:CodebaseEntity {{id: row.from}}) ON CREATE SET a.stub = true
MERGE (b:CodebaseEntity {{id: row.to}}) ON CREATE SET b.stub = true
MERGE (a)-[r:{rel}]->(b)
SET r += row.props
""" for rel in RELATIONSHIPS}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True, strict=True)


def _storable(value: Any) -> bool:
    """FalkorDB stores scalars and arrays of scalars; never maps or nulls."""
    if isinstance(value, list):
        return all(isinstance(item, SCALARS) for item in value)
    return isinstance(value, SCALARS)


def _check_props(props: dict[str, Any]) -> dict[str, Any]:
    for key, value in props.items():
        if not _storable(value):
            raise ValueError(f"property {key!r} must be a string, number, boolean or an array of them")
        # NaN, Infinity or a NUL stored once would fail every later read of the node (a "poison" value).
        problem = value_problem(value, key)
        if problem:
            raise ValueError(problem)
    return props


Props = Annotated[dict[PropName, Any], AfterValidator(_check_props)]


class NodeRecord(_Strict):
    """A node, merged by id."""

    id: EntityId
    labels: list[Label] = Field(default_factory=list, max_length=len(LABELS))
    props: Props = Field(default_factory=dict)

    @model_validator(mode="after")
    def _no_id_prop(self) -> NodeRecord:
        if "id" in self.props or "stub" in self.props:
            raise ValueError("props may not set 'id' or 'stub'")
        return self


class EdgeRecord(_Strict):
    """A relationship between two ids, merged by (from, type, to)."""

    from_: EntityId = Field(alias="from")
    to: EntityId
    type: Relationship
    props: Props = Field(default_factory=dict)


class Record(_Strict):
    """One line of a KG file: exactly one of node and edge."""

    node: NodeRecord | None = None
    edge: EdgeRecord | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Record:
        if (self.node is None) == (self.edge is None):
            raise ValueError("a record holds exactly one of 'node' and 'edge'")
        return self


class UpsertParams(_Strict):
    """Params of the `kg.upsert` method."""

    nodes: list[NodeRecord] = Field(default_factory=list, max_length=MAX_RECORDS)
    edges: list[EdgeRecord] = Field(default_factory=list, max_length=MAX_RECORDS)


def parse_record(line_number: int, text: str) -> Record:
    """One line; raises BadRecord naming the line and the first bad field."""
    try:
        return Record.model_validate_json(text)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        field = ".".join(str(part) for part in error["loc"]) or "record"
        raise BadRecord(line_number, field, error["msg"]) from None


def parse_lines(lines: Iterable[str]) -> tuple[list[NodeRecord], list[EdgeRecord]]:
    """Every record of a file (blank lines skipped), or BadRecord for the first bad one."""
    nodes: list[NodeRecord] = []
    edges: list[EdgeRecord] = []
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        record = parse_record(number, text)
        if record.node is not None:
            nodes.append(record.node)
        if record.edge is not None:
            edges.append(record.edge)
    return nodes, edges


def load_file(path: Path) -> tuple[list[NodeRecord], list[EdgeRecord]]:
    """Parse a JSON Lines file whole, before anything is written."""
    with path.open(encoding="utf-8") as lines:
        return parse_lines(lines)


def _batches(items: list[Any]) -> Iterator[list[Any]]:
    for start in range(0, len(items), BATCH):
        yield items[start:start + BATCH]


async def upsert(graph: Graph, nodes: list[NodeRecord], edges: list[EdgeRecord],
                 on_progress: Progress | None = None) -> tuple[int, int]:
    """Merge nodes (by id) then edges, in UNWIND batches; returns (nodes, edges) upserted."""
    total, done = len(nodes) + len(edges), 0
    for batch in _batches(nodes):
        await _upsert_nodes(graph, batch)
        done += len(batch)
        _report(on_progress, done, total)
    for rel, group in _by_type(edges).items():
        for batch in _batches(group):
            await graph.query(MERGE_EDGES[rel], {"rows": batch})
            done += len(batch)
            _report(on_progress, done, total)
    return len(nodes), len(edges)


async def _upsert_nodes(graph: Graph, batch: list[NodeRecord]) -> None:
    await graph.query(MERGE_NODES, {"rows": [{"id": node.id, "props": node.props} for node in batch]})
    for label, ids in _by_label(batch).items():
        await graph.query(ADD_LABEL[label], {"ids": ids})


def _by_label(nodes: list[NodeRecord]) -> dict[Label, list[str]]:
    """Node ids per label beyond the base label every node has."""
    groups: defaultdict[Label, list[str]] = defaultdict(list)
    for node in nodes:
        for label in dict.fromkeys(node.labels):
            if label != BASE_LABEL:
                groups[label].append(node.id)
    return groups


def _by_type(edges: list[EdgeRecord]) -> dict[Relationship, list[dict[str, Any]]]:
    groups: defaultdict[Relationship, list[dict[str, Any]]] = defaultdict(list)
    for edge in edges:
        groups[edge.type].append({"from": edge.from_, "to": edge.to, "props": edge.props})
    return groups


def _report(on_progress: Progress | None, done: int, total: int) -> None:
    if on_progress is not None:
        on_progress(done, total)
