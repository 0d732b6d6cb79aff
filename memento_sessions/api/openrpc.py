"""`rpc.discover`: the OpenRPC 1.3 document of every declared method, from the table itself.

Each method's params are its params model's fields (by name), its result the JSON schema of its result
type, its errors the JSON-RPC errors any method may return; docs/openrpc.json is this document, published.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, TypeAdapter

from memento_sessions import __version__
from memento_sessions.api.spec import Declared
from memento_sessions.errors import (
    BackendUnavailable,
    Conflict,
    Forbidden,
    InvalidParams,
    NotFound,
    RateLimited,
    RpcError,
)

ERRORS: tuple[tuple[type[RpcError], str], ...] = (
    (InvalidParams, "invalid params: data lists each field and what is wrong with it"),
    (Forbidden, "the token lacks the method's scope"),
    (NotFound, "what the params name does not exist in the caller's namespace"),
    (Conflict, "the state refuses the request; data.reason says why (errors.Reason)"),
    (RateLimited, "over the caller's rate; data.retryAfterMs says when to try again"),
    (BackendUnavailable, "Redis, FalkorDB or Postgres did not answer; data.backend names it"),
)
REF_TEMPLATE = "#/components/schemas/{model}"


def document(methods: tuple[Declared, ...]) -> dict[str, Any]:
    """The OpenRPC document of `methods`, their shared schemas under components."""
    schemas: dict[str, Any] = {}
    described = [method(declared, schemas) for declared in methods]
    return {"openrpc": "1.3.2",
            "info": {"title": "memento-sessions", "version": __version__,
                     "description": "The JSON-RPC 2.0 API of the memento-sessions daemon, over /ws (and MCP)."},
            "methods": described,
            "components": {"schemas": dict(sorted(schemas.items())),
                           "errors": {kind.__name__: error(kind, text) for kind, text in ERRORS}}}


def method(declared: Declared, schemas: dict[str, Any]) -> dict[str, Any]:
    """One method: its params (by name), result, scope and errors."""
    return {"name": declared.name, "summary": declared.summary, "paramStructure": "by-name",
            "params": params(declared.params, schemas),
            "result": {"name": f"{declared.name} result", "schema": schema(TypeAdapter(declared.result), schemas)},
            "errors": [{"$ref": f"#/components/errors/{kind.__name__}"} for kind, _ in ERRORS],
            "x-scope": declared.scope}


def params(model: type[BaseModel], schemas: dict[str, Any]) -> list[dict[str, Any]]:
    """The params model's fields as content descriptors, each with its JSON schema."""
    whole = schema(TypeAdapter(model), schemas, inline=True)
    required = set(whole.get("required", ()))
    return [{"name": name, "required": name in required, "schema": field}
            for name, field in whole.get("properties", {}).items()]


def schema(adapter: TypeAdapter[Any], schemas: dict[str, Any], *, inline: bool = False) -> dict[str, Any]:
    """The type's JSON schema, its definitions moved to the shared components; inline: the top one too."""
    found = adapter.json_schema(ref_template=REF_TEMPLATE)
    schemas.update({name: unnoticed(defined) for name, defined in found.pop("$defs", {}).items()})
    found = unnoticed(found)
    title = found.get("title")
    if inline or not isinstance(title, str) or found.get("type") != "object":
        return found
    schemas[title] = found
    return {"$ref": REF_TEMPLATE.format(model=title)}


def unnoticed(found: dict[str, Any]) -> dict[str, Any]:
    """A result's schema without the optional `notices` only MCP tool results carry (client/results.Noticed)."""
    properties = found.get("properties", {})
    if "notices" not in properties or "notices" in found.get("required", ()):
        return found
    return {**found, "properties": {name: value for name, value in properties.items() if name != "notices"}}


def error(kind: type[RpcError], text: str) -> dict[str, Any]:
    return {"code": kind.code, "message": text}
