"""The wire contract does not move by accident: the MCP tools and the JSON-RPC methods against their snapshots.

tests/fixtures/mcp_tools.json holds every MCP tool (name, description, input and output schemas, hints) and
tests/fixtures/rpc_methods.json every JSON-RPC method (name, scope, params schema) as agents and clients
know them. A change to either is a change of the contract: run with MEMENTO_UPDATE_CONTRACT=1 to write the
new snapshot, and review its diff as such.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from memento_sessions.mcp.tools import build_server
from memento_sessions.rpc import Registry
from memento_sessions.server.daemon import Daemon

pytestmark = pytest.mark.anyio
FIXTURES = Path(__file__).parent / "fixtures"


def same_as_snapshot(name: str, live: Any) -> None:
    """`live` equals the snapshot `name` (written instead when MEMENTO_UPDATE_CONTRACT is set)."""
    path = FIXTURES / name
    if os.environ.get("MEMENTO_UPDATE_CONTRACT"):
        path.write_text(json.dumps(live, indent=1, sort_keys=True) + "\n")
    assert live == json.loads(path.read_text())


async def live_tools() -> list[dict[str, Any]]:
    """Every MCP tool as `tools/list` shows it, in its order."""
    return [tool.model_dump(mode="json", by_alias=True, exclude_none=True)
            for tool in await build_server(Registry()).list_tools()]


def live_methods(registry: Registry) -> dict[str, Any]:
    """Every JSON-RPC method: its scope and the JSON schema of its params."""
    return {name: {"scope": method.scope, "params": method.params.model_json_schema()}
            for name, method in sorted(registry.methods.items())}


async def test_the_mcp_tools_are_the_snapshot() -> None:
    tools = await live_tools()
    assert len(tools) >= 26
    same_as_snapshot("mcp_tools.json", tools)


async def test_the_json_rpc_methods_are_the_snapshot(daemon: Daemon) -> None:
    assert daemon.services is not None
    methods = live_methods(daemon.services.registry)
    assert len(methods) >= 33
    same_as_snapshot("rpc_methods.json", methods)
