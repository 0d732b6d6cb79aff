"""A parameterised FalkorDB query as its client sends it, encoded by the falkordb package itself."""

from __future__ import annotations

from typing import Any

from falkordb.helpers import stringify_param_value


def query(cypher: str, params: dict[str, Any]) -> str:
    """`CYPHER `k`=v ... <cypher>`: the query string the falkordb client builds for GRAPH.QUERY."""
    header = "".join(f"`{name}`={stringify_param_value(value)} " for name, value in params.items())
    return f"CYPHER {header}{cypher}"
