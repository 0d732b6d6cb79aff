"""JSON-RPC 2.0 without I/O: parse a frame, validate params, call the method, encode the reply.

The transports (the WebSocket gateway, the MCP tools) own the sockets; this module only turns
one request frame into one response frame, so every method answers the same way everywhere.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, get_args, get_origin

import asyncpg
import pydantic_core
from pydantic import BaseModel, ValidationError

from memento_sessions.auth import Identity
from memento_sessions.backends import UNAVAILABLE, out_of_memory
from memento_sessions.errors import (
    BackendUnavailable,
    InvalidParams,
    InvalidRequest,
    MethodNotFound,
    ParseError,
    Reason,
    RpcError,
)
from memento_sessions.limits import FOREGROUND, TokenBucket, let_go
from memento_sessions.logs import get_logger
from memento_sessions.metrics import BACKEND_ERRORS

log = get_logger(__name__)
P = TypeVar("P", bound=BaseModel)
Result = dict[str, Any]
Handler = Callable[["Call", Any], Awaitable[Result]]  # a method's handler: (caller, validated params) -> result
ConnectHook = Callable[["Call"], Awaitable[None]]
LARGE_FRAME = 64 * 1024  # request frames this large have their lists of models validated a part at a time
PART = 16  # items of such a list validated between two turns of the event loop


class Peer(Protocol):
    """What a method may ask of the connection that called it (subscriptions need it)."""

    conn_id: str

    def notify(self, frame: str) -> None:
        """Queue one frame for the client; never blocks (an overflow closes the client as slow)."""

    async def wait_room(self, nbytes: int) -> None:
        """Wait until `nbytes` more fit in the client's send buffer (replays pace themselves here)."""

    def on_close(self, cleanup: Callable[[], None]) -> None:
        """Run `cleanup` when the connection ends."""


@dataclass(frozen=True, slots=True)
class Call:
    """Who calls, and over which connection (None for MCP and in-process calls)."""

    identity: Identity
    peer: Peer | None = None


@dataclass(frozen=True, slots=True)
class Method(Generic[P]):
    """A registered method: its params model, its handler and the scope it needs."""

    name: str
    params: type[P]
    handler: Callable[[Call, P], Awaitable[Result]]
    scope: str


class Registry:
    """The method table shared by every transport; api/ fills it once at start (`api.build.registry`)."""

    def __init__(self, on_connect: Sequence[ConnectHook] = ()) -> None:
        """`on_connect`: run for each new connection before it is accepted (coordination: presence and the
        agent's pushes), so a client that never sends a request is present and gets its pushes at once."""
        self.methods: dict[str, Method[Any]] = {}
        self.on_connect = tuple(on_connect)

    async def connected(self, call: Call) -> None:
        """Run the connect hooks for a new connection, in the order they were added."""
        for hook in self.on_connect:
            await hook(call)

    def add(self, name: str, params: type[P], handler: Callable[[Call, P], Awaitable[Result]],
            scope: str = "sessions:read") -> None:
        """Register `handler` under `name`; a name registered twice is an error at start, never a replacement."""
        if name in self.methods:
            raise ValueError(f"method {name!r} is registered twice")
        self.methods[name] = Method(name, params, handler, scope)

    async def call(self, call: Call, name: str, raw_params: Any, request_id: Any = None) -> Result:
        """Validate and run one method; raises RpcError subclasses (a backend failure as a clean -32050)."""
        method, params = self.resolve(call, name, raw_params)
        return await self.run(call, method, params, request_id)

    def resolve(self, call: Call, name: str, raw_params: Any, validated: bool = True) -> tuple[Method[Any], Any]:
        """The method and its validated params (unless `validated` is False); MethodNotFound, Forbidden or
        InvalidParams. No I/O."""
        method = self.methods.get(name)
        if method is None:
            raise MethodNotFound(f"unknown method {name!r}", {"method": name})
        call.identity.require(method.scope)
        return method, validate(method.params, raw_params) if validated else raw_params

    async def run(self, call: Call, method: Method[Any], params: Any, request_id: Any = None) -> Result:
        """A resolved method's result; a backend failure raised as a clean -32050."""
        try:
            return await method.handler(call, params)
        except FAILURES as exc:
            raise unavailable(exc, call, method.name, request_id) from None
        except Exception as exc:
            if not out_of_memory(exc):
                raise
            raise unavailable(exc, call, method.name, request_id) from None


# The one place a backend failure becomes what a client sees. Driver messages name hosts, ports and
# socket paths, so the client gets only the backend's name; the details go to the log.
FAILURES: tuple[type[BaseException], ...] = (*UNAVAILABLE, BackendUnavailable)
BACKENDS = {"redis": "Redis", "falkordb": "FalkorDB", "postgres": "Postgres"}


def unavailable(exc: BaseException, call: Call, method: str, request_id: Any) -> BackendUnavailable:
    """`backend unavailable: Postgres` with `data.backend`, counted and logged with the request id; a Redis at
    its maxmemory (which refuses writes rather than evict data) adds `data.reason: "outOfMemory"`."""
    backend = backend_name(exc)
    BACKEND_ERRORS.labels(backend).inc()
    log.warning("backend unavailable", backend=backend, method=method, request_id=request_id,
                agent_id=call.identity.agent_id, namespace=call.identity.namespace,
                conn_id=call.peer.conn_id if call.peer else None, error=_cause(exc))
    if out_of_memory(exc):
        return BackendUnavailable(f"backend out of memory: {BACKENDS[backend]} refuses writes",
                                  {"backend": backend, "reason": Reason.OUT_OF_MEMORY})
    data = {"backend": backend}
    if isinstance(exc, BackendUnavailable) and isinstance(exc.data, dict) and "reason" in exc.data:
        data["reason"] = exc.data["reason"]  # e.g. replica_ack_timeout: the write may not survive a failover
    return BackendUnavailable(f"backend unavailable: {BACKENDS[backend]}", data)


def backend_name(exc: BaseException) -> str:
    """redis, falkordb or postgres: which backend a failure came from.

    A BackendUnavailable names its backend first (`falkordb: ...`). A bare driver error is Postgres's
    when asyncpg raised it, else Redis's: FalkorDB is reached with a redis-py client, so a FalkorDB call
    that does not wrap its errors in BackendUnavailable("falkordb: ...") is reported as Redis.
    """
    if isinstance(exc, BackendUnavailable):
        return next((name for name in BACKENDS if exc.message.lower().startswith(name)), "redis")
    return "postgres" if isinstance(exc, asyncpg.PostgresError | asyncpg.InterfaceError) else "redis"


def _cause(exc: BaseException) -> str:
    """The driver's own words (`ConnectionError: Error 111 connecting to ...`), for the log only."""
    cause = exc.__cause__ or exc
    return f"{type(cause).__name__}: {cause}"



def validate(model: type[P], raw: Any) -> P:
    """Build the params model, turning every validation error into one field entry."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise InvalidParams("params must be an object", [{"field": "params", "message": "must be an object"}])
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise InvalidParams("invalid params", field_errors(exc)) from None


def field_errors(exc: ValidationError) -> list[dict[str, str]]:
    """`[{"field": "event.changeInfo.entityIds", "message": ...}]` from a pydantic error."""
    return [
        {"field": ".".join(str(part) for part in err["loc"]) or "params", "message": err["msg"]}
        for err in exc.errors(include_url=False)
    ]


def parse(frame: str | bytes) -> dict[str, Any]:
    """Decode one request object; raises ParseError or InvalidRequest."""
    try:
        # Values are seldom repeated (ids, texts), keys often: caching every string made a 700 KB batch of
        # 76,800 distinct ids parse 2.5 times slower.
        message = pydantic_core.from_json(frame, cache_strings="keys")
    except (ValueError, TypeError):  # TypeError: a str holding a lone surrogate, which is no UTF-8 text
        raise ParseError("parse error: frame is not valid JSON") from None
    if not isinstance(message, dict):
        raise InvalidRequest("a request must be a JSON object (batches are not supported)")
    if message.get("jsonrpc") != "2.0" or not isinstance(message.get("method"), str):
        raise InvalidRequest("a request needs jsonrpc '2.0' and a string method")
    if ("id" in message and not isinstance(message["id"], str | int | None)) or isinstance(message.get("id"), bool):
        raise InvalidRequest("id must be a string, a number or null")
    return message


def encode_result(request_id: Any, result: Result) -> bytes:
    """The response frame of a successful call."""
    return pydantic_core.to_json({"jsonrpc": "2.0", "id": request_id, "result": result})


def encode_error(request_id: Any, error: RpcError) -> bytes:
    """The response frame of a failed call."""
    return pydantic_core.to_json({"jsonrpc": "2.0", "id": request_id, "error": error.to_dict()})


def encode_notification(method: str, params: Result) -> bytes:
    """A server-to-client notification frame."""
    return pydantic_core.to_json({"jsonrpc": "2.0", "method": method, "params": params})


@dataclass(slots=True)
class Request:
    """A request frame made ready to run (parsed, rate-limited, its method resolved and params validated), or
    the error it gets instead of running."""

    message: dict[str, Any]
    method: Method[Any] | None = None
    params: Any = None
    error: RpcError | None = None


def prepare(registry: Registry, call: Call, frame: str | bytes, bucket: TokenBucket | None = None,
            validated: bool = True) -> Request:
    """All of a request that needs no backend: CPU only, so a transport may prepare the next frame while the
    request before it awaits its backend (the requests still run in order). With `validated` False the
    params are left as the frame gave them, for the caller to validate."""
    try:
        message = parse(frame)
    except RpcError as exc:
        return Request({"id": None}, error=exc)
    return resolved(registry, call, message, bucket, validated)


def resolved(registry: Registry, call: Call, message: dict[str, Any], bucket: TokenBucket | None,
             validated: bool) -> Request:
    """A parsed request, rate-limited, its method resolved and (when `validated`) its params validated."""
    try:
        if bucket is not None:
            bucket.take()
        method, params = registry.resolve(call, message["method"], message.get("params"), validated)
    except RpcError as exc:
        return Request(message, error=exc)
    except Exception:
        log.exception("method failed", agent_id=call.identity.agent_id)
        return Request(message, error=RpcError("internal error"))
    return Request(message, method, params)


async def prepare_in_parts(registry: Registry, call: Call, frame: str | bytes,
                           bucket: TokenBucket | None = None) -> Request:
    """`prepare`, for a large frame a part at a time with a turn for other connections between parts: its
    list of objects (a batch's events) parsed FRAME_PART characters at a time (`parse_in_parts`), then its
    lists of models validated PART items at a time (validating 100,000 ids runs Python code per id, tens of
    ms in one stretch otherwise). The result, and any error, is `prepare`'s."""
    if len(frame) < LARGE_FRAME:
        return prepare(registry, call, frame, bucket)
    try:
        message = await parse_in_parts(frame)
    except RpcError as exc:
        return Request({"id": None}, error=exc)
    request = resolved(registry, call, message, bucket, validated=False)
    if request.method is None or request.error is not None:
        return request
    raw = request.params
    try:
        parts = await items_in_parts(request.method.params, raw)
        request.params = validate(request.method.params, raw if parts is None else {**raw, **parts})
    except RpcError as exc:
        return Request(request.message, error=exc)
    return request


# A large frame is parsed a part at a time where it can be cut between two objects of one list of its
# params (`},{`, as compact JSON writes a batch's events). The text before the first cut and after the last
# one, joined by a placeholder element, is parsed first: when the placeholder then stands in a list of the
# params, every cut up to there lies between two elements of that list (a cut inside a string or a
# deeper object leaves text that is not JSON, or puts the placeholder elsewhere). Each part between cuts
# is then parsed as a list of its own; one that does not parse (a cut inside an element) sends the whole
# frame to `parse`, so the result, and any error, is always `parse`'s. The placeholder holds a NUL and
# random bytes a client cannot guess.
FRAME_PART = 32 * 1024  # characters of such a list parsed between two turns of the event loop (about 0.3 ms)
CUT = "},{"
_HOLE = "\x00" + secrets.token_hex(16)
_HOLE_JSON = pydantic_core.to_json(_HOLE).decode()


async def parse_in_parts(frame: str | bytes) -> dict[str, Any]:
    """`parse`, with a large text frame's list of objects parsed FRAME_PART characters at a time."""
    if not isinstance(frame, str):
        return parse(frame)
    first, last = frame.find(CUT), frame.rfind(CUT)
    if first < 0 or last - first < FRAME_PART:
        return parse(frame)
    try:
        message = parse(f"{frame[:first + 1]},{_HOLE_JSON},{frame[last + 2:]}")
    except RpcError:
        return parse(frame)
    items = _holding(message)
    if items is None:
        return parse(frame)
    # Later cuts must open an element as the one after the last cut does (`},{"type":`, say), which a cut
    # inside an element seldom matches.
    opening = frame.find(":", last, last + 64)
    cut = frame[last:opening + 1] if opening > 0 else CUT
    values: list[Any] = []
    start = first
    while start < last:
        end = frame.find(cut, start + FRAME_PART, last)
        end = last if end < 0 else end
        await FOREGROUND.turn()
        try:
            values += pydantic_core.from_json(f"[{frame[start + 2:end + 1]}]", cache_strings="keys")
        except (ValueError, TypeError):
            return parse(frame)
        start = end
    at = items.index(_HOLE)
    items[at:at + 1] = values
    return message


def _holding(message: dict[str, Any]) -> list[Any] | None:
    """The list of the message's params that holds the placeholder once, if one does and no other does."""
    params = message.get("params")
    if not isinstance(params, dict):
        return None
    holding = [items for items in params.values() if isinstance(items, list) and _HOLE in items]
    return holding[0] if len(holding) == 1 and holding[0].count(_HOLE) == 1 else None


async def items_in_parts(model: type[BaseModel], raw: Any) -> dict[str, list[Any]] | None:
    """`raw`'s lists of models validated PART items at a time: the validated lists by field name, or None when
    it has none (or an item is invalid: the whole params are then validated at once, for the same errors)."""
    if not isinstance(raw, dict):
        return None
    parts: dict[str, list[Any]] = {}
    for name, item in model_lists(model):
        values = raw.get(name)
        if not isinstance(values, list):
            continue
        done: list[Any] = []
        for start in range(0, len(values), PART):
            try:
                done += [item.model_validate(value) for value in values[start:start + PART]]
            except ValidationError:
                return None
            await FOREGROUND.turn()
        parts[name] = done
    return parts or None


async def let_go_of(request: Request) -> None:
    """A large request, once answered: its lists of models (a batch's events) and the raw lists they were
    validated from emptied PART items at a time, with a turn for other connections between (limits.let_go).
    Freed at once when the request goes, a batch's 76,800 entity ids held the event loop about 2 ms. The
    handlers are done with the request by then; a model one of them kept stays whole."""
    lists: list[list[Any]] = []
    if isinstance(request.params, BaseModel):
        found = (getattr(request.params, name) for name, _ in model_lists(type(request.params)))
        lists += [items for items in found if isinstance(items, list)]
    raw = request.message.get("params")
    if isinstance(raw, dict):
        lists += [items for items in raw.values() if isinstance(items, list)]
    for items in lists:
        await let_go(items, PART)


def model_lists(model: type[BaseModel]) -> list[tuple[str, type[BaseModel]]]:
    """The fields of `model` that are lists of models: (name, item model)."""
    found = []
    for name, field in model.model_fields.items():
        args = get_args(field.annotation)
        if get_origin(field.annotation) is list and args and isinstance(args[0], type) \
                and issubclass(args[0], BaseModel):
            found.append((name, args[0]))
    return found


async def answer(registry: Registry, call: Call, request: Request) -> bytes | None:
    """The response frame of a prepared request (None for a notification)."""
    message = request.message
    if request.method is None or request.error is not None:
        error = request.error or RpcError("internal error")
    else:
        try:
            result = await registry.run(call, request.method, request.params, message.get("id"))
        except RpcError as exc:
            error = exc
        except Exception:
            log.exception("method failed", agent_id=call.identity.agent_id)
            error = RpcError("internal error")
        else:
            return encode_result(message["id"], result) if "id" in message else None
    return encode_error(message["id"], error) if "id" in message else None

