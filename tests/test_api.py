"""The declared table (memento_sessions/api/) is the one source of the API: the registry, rpc.discover's OpenRPC
document, docs/openrpc.json and the README's method tables are all read from it or checked against it."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
from referencing import Registry as Schemas
from referencing import Resource
from referencing.jsonschema import DRAFT7

from memento_sessions.api import table
from memento_sessions.api.table import METHODS, openrpc_document, stack
from memento_sessions.errors import Reason
from memento_sessions.rpc import Registry
from memento_sessions.server.daemon import Daemon
from memento_sessions.sessions.methods import Params
from tests.helpers import token
from tests.rpcsocket import rpc

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).parent.parent
FIXTURES = Path(__file__).parent / "fixtures"
PACKAGE = ROOT / "memento_sessions"


def test_every_method_is_declared_once_and_a_second_registration_fails() -> None:
    names = [declared.name for declared in METHODS]
    assert len(names) == len(set(names)) == 39
    registry = Registry()

    async def handler(call: Any, params: Any) -> dict[str, Any]:
        return {}

    registry.add("session.get", Params, handler)
    with pytest.raises(ValueError, match=r"'session\.get' is registered twice"):
        registry.add("session.get", Params, handler)
    assert registry.methods["session.get"].handler is handler


async def test_steps_run_in_their_declared_order_around_the_handler() -> None:
    ran: list[str] = []

    def step(name: str) -> Any:
        def around(parts: Any, inner: Any) -> Any:
            async def handler(call: Any, params: Any) -> dict[str, Any]:
                ran.append(f"{name} before")
                result = await inner(call, params)
                ran.append(f"{name} after")
                return dict(result)
            return handler
        return around

    async def core(call: Any, params: Any) -> dict[str, Any]:
        ran.append("handler")
        return {}

    emit = next(declared for declared in METHODS if declared.name == "event.emit")
    names = [step.__name__ for step in emit.steps]
    # a break or fix is told after the rest; the fencing sync (and a task's claim) before the write; presence,
    # the commit index and the usage fold after it
    assert names == ["outcome", "fenced_emit", "visit", "note_commits", "usage_fold"]
    mine = dataclasses.replace(emit, handler=lambda parts: core, steps=(step("a"), step("b")))
    every = table.AROUND_EVERY_METHOD
    table.AROUND_EVERY_METHOD = (step("every"),)
    try:
        await stack(mine, None)(None, None)  # type: ignore[arg-type]
    finally:
        table.AROUND_EVERY_METHOD = every
    assert ran == ["every before", "a before", "b before", "handler", "b after", "a after", "every after"]


def meta_schema_registry() -> Schemas[Any]:
    """The OpenRPC meta-schema refers to its JSON Schema meta-schema by URL: both are vendored, no network."""
    schema = json.loads((FIXTURES / "json_schema_tools_meta_schema.json").read_text())
    resource = Resource.from_contents(schema, default_specification=DRAFT7)
    return Schemas().with_resources([("https://meta.json-schema.tools", resource),
                                     ("https://meta.json-schema.tools/", resource)])


def test_the_openrpc_document_is_valid_and_covers_every_method() -> None:
    document = openrpc_document()
    meta = json.loads((FIXTURES / "openrpc_meta_schema.json").read_text())
    jsonschema.Draft7Validator(meta, registry=meta_schema_registry()).validate(document)
    assert document["openrpc"] == "1.3.2"
    assert [method["name"] for method in document["methods"]] == [declared.name for declared in METHODS]
    emit = next(method for method in document["methods"] if method["name"] == "event.emit")
    assert [(p["name"], p["required"]) for p in emit["params"]] == [("sessionId", True), ("event", True)]
    assert emit["result"]["schema"] == {"$ref": "#/components/schemas/Emitted"}
    emitted = document["components"]["schemas"]["Emitted"]
    assert emitted["required"] == ["seq", "duplicate"]
    codes = {error["code"] for error in document["components"]["errors"].values()}
    assert codes == {-32602, -32001, -32004, -32009, -32029, -32050}


def test_an_invalid_document_fails_the_meta_schema() -> None:
    meta = json.loads((FIXTURES / "openrpc_meta_schema.json").read_text())
    broken = {**openrpc_document(), "openrpc": "9.9.9"}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(meta, registry=meta_schema_registry()).validate(broken)


def test_docs_openrpc_json_is_the_generated_document() -> None:
    published = json.loads((ROOT / "docs" / "openrpc.json").read_text())
    assert published == json.loads(json.dumps(openrpc_document())), \
        "regenerate it: .venv/bin/python scripts/openrpc.py"


async def test_rpc_discover_answers_the_document_over_the_websocket(daemon: Daemon, namespace: str) -> None:
    async with rpc(daemon.port, token("reader", namespace)) as peer:
        found = await peer.call("rpc.discover", {})
        refused = await peer.request("rpc.discover", {"extra": 1})
    assert found == json.loads(json.dumps(openrpc_document()))
    assert len(found["methods"]) == 39
    assert refused["error"]["code"] == -32602 and refused["error"]["data"][0]["field"] == "extra"


def test_the_readme_tables_list_every_method() -> None:
    rows = [line.split("|")[1] for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| ")]
    listed = {name for cell in rows for name in re.findall(r"\b([a-z]+\.[a-z][A-Za-z]+)\b", cell)}
    missing = [declared.name for declared in METHODS if declared.name not in listed]
    assert missing == []


def lua_reasons() -> set[str]:
    """Every `FULL <reason>` the Lua libraries reply with."""
    found: set[str] = set()
    for path in PACKAGE.rglob("*.lua"):
        found |= set(re.findall(r"'FULL ([a-z_]+) ", path.read_text()))
    return found


def test_the_lua_reasons_are_in_the_enumeration() -> None:
    reasons = lua_reasons()
    assert {"session_full", "namespace_full", "stale_lease", "lease_limit", "mailbox_limit"} <= reasons
    assert reasons <= {reason.value for reason in Reason}


def test_every_reason_is_documented_in_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    assert [reason.value for reason in Reason if f"`{reason.value}`" not in readme] == []
