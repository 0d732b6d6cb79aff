"""Strict JSON types in every method's params: a number sent as text, a boolean as a number or text as a boolean
is -32602 naming the field, never coerced (`"60"` is not 60, `true` is not 1, `"yes"` is not true)."""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from memento_sessions.server.daemon import Daemon
from tests.helpers import token
from tests.rpcsocket import rpc

pytestmark = pytest.mark.anyio
ALL_SCOPES = "sessions:read sessions:write kg:write admin"
WRONG: dict[type, list[Any]] = {int: ["60", True, 60.5], bool: ["yes", 1, "true"], float: ["0.5", True]}


def options(annotation: Any) -> tuple[Any, ...]:
    """The types a field may hold: a union's members (Annotated stripped), else the one type."""
    union = isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union
    found = typing.get_args(annotation) if union else (annotation,)
    return tuple(typing.get_args(item)[0] if typing.get_origin(item) is typing.Annotated else item for item in found)


def scalar(annotation: Any) -> type | None:
    """int, bool or float when the field holds one (optional or not), else None."""
    found = [option for option in options(annotation) if option in WRONG]
    return found[0] if found else None


def nested(annotation: Any) -> tuple[type[BaseModel], bool] | None:
    """The params model a field holds (and whether in a list), else None."""
    for option in options(annotation):
        inner = typing.get_args(option)[0] if typing.get_origin(option) is list else option
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            return inner, inner is not option
    return None


def typed_fields(model: type[BaseModel], depth: int = 0) -> Iterator[tuple[list[str | int], type]]:
    """Every int/bool/float field of a params model, nested ones included, as (path, type)."""
    for name, info in model.model_fields.items():
        wire = info.alias or name
        kind = scalar(info.annotation)
        if kind is not None:
            yield [wire], kind
        inner = nested(info.annotation)
        if inner is not None and depth < 3:
            for path, found in typed_fields(inner[0], depth + 1):
                yield [wire, 0, *path] if inner[1] else [wire, *path], found


def params_at(path: list[str | int], value: Any) -> Any:
    """`{"event": {"changeInfo": {"affectedLines": value}}}` from a path; a list index makes a one-item list."""
    if not path:
        return value
    head, rest = path[0], params_at(path[1:], value)
    return [rest] if isinstance(head, int) else {head: rest}


def cases(daemon: Daemon) -> list[tuple[str, list[str | int], Any]]:
    assert daemon.services is not None
    return [(name, path, value) for name, method in sorted(daemon.services.registry.methods.items())
            for path, kind in typed_fields(method.params) for value in WRONG[kind]]


async def test_every_integer_boolean_and_number_param_of_every_method_refuses_the_wrong_json_type(
        daemon: Daemon, namespace: str) -> None:
    found = cases(daemon)
    named = {(name, ".".join(str(part) for part in path)) for name, path, _ in found}
    # The fields a coercion was seen on, each a case here (the walk must not silently miss them).
    for expected in [("session.create", "ttl"), ("session.get", "since"), ("session.get", "limit"),
                     ("session.fork", "atSeq"), ("session.get", "atSeq"), ("event.emit", "event.fencingToken"),
                     ("event.emitBatch", "events.0.fencingToken"), ("lease.acquire", "ttl"),
                     ("mailbox.read", "unreadOnly"), ("mailbox.read", "since"), ("mailbox.send", "ttl"),
                     ("session.checkpoint", "final"), ("session.get", "condensed"),
                     ("event.emit", "event.changeInfo.affectedLines"),
                     ("event.emit", "event.stateTransition.confidence"), ("bridge.outcomes", "days")]:
        assert expected in named, expected
    assert len(found) >= 80, len(found)
    coerced: list[str] = []
    async with rpc(daemon.port, token("a", namespace, ALL_SCOPES)) as peer:
        for name, path, value in found:
            field = ".".join(str(part) for part in path)
            reply = await peer.request(name, params_at(path, value))
            error = reply.get("error") or {}
            fields = [item.get("field") for item in error.get("data") or ()] if isinstance(error.get("data"), list) \
                else []
            if error.get("code") != -32602 or field not in fields:
                coerced.append(f"{name} {field}={value!r}: {reply.get('error') or 'accepted'}")
    assert coerced == [], f"{len(coerced)} of {len(found)} coerced or misnamed:\n" + "\n".join(coerced)


@pytest.mark.parametrize(("to", "why"), [
    ("role:", "role:<name>"), ("role:a:b", "role:<name>"), ("role:" + "r" * 65, "role:<name>"),
    ("session:", "session:<id>"), ("session:" + "s" * 129, "session:<id>"), ("a b", "agent id"),
])
async def test_a_malformed_recipient_is_refused_naming_to_not_sent_to_nobody(daemon: Daemon, namespace: str,
                                                                               to: str, why: str) -> None:
    async with rpc(daemon.port, token("a", namespace)) as a:
        error = await a.error("mailbox.send", {"to": to, "body": 1})
        assert error["code"] == -32602
        assert [item["field"] for item in error["data"]] == ["to"] and why in error["data"][0]["message"]


def schema_kinds(prop: dict[str, Any]) -> set[str]:
    """The JSON types a tool's inputSchema property allows."""
    return {str(item.get("type")) for item in prop.get("anyOf", [prop])}


async def test_every_integer_and_boolean_argument_of_every_mcp_tool_refuses_the_wrong_json_type(
        daemon: Daemon, namespace: str) -> None:
    from tests.test_mcp import over_http

    coerced: list[str] = []
    tried = 0
    async with over_http(daemon.port, token("m", namespace, ALL_SCOPES)) as mcp:
        for tool in (await mcp.list_tools()).tools:
            for name, prop in tool.input_schema.get("properties", {}).items():
                kinds = schema_kinds(prop)
                wrong = WRONG[int] if "integer" in kinds else WRONG[bool] if "boolean" in kinds else []
                for value in wrong[:2]:
                    tried += 1
                    reply = await mcp.call_tool(tool.name, {name: value})
                    text = str(reply.content)
                    if not (reply.is_error and "invalid params (-32602)" in text and f"{name}:" in text):
                        coerced.append(f"{tool.name} {name}={value!r}: {text[:160]}")
    assert tried >= 30, tried
    assert coerced == [], f"{len(coerced)} of {tried} coerced:\n" + "\n".join(coerced)
