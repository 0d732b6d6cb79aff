"""`POST /hooks/claude-code` (Claude Code's http hooks) and `POST /hooks/gemini-cli` (a Gemini CLI hook input,
converted by ingest/gemini_hooks.py), answered by the daemon itself.

The body is the hook input a command hook would read on stdin; the bearer token is the agent's (Claude Code
fills the Authorization header from an environment variable the hook lists in `allowedEnvVars`). The
input's events go into its session as the session's own agent (auth.session_agent) and the reply is
the hook JSON output of `hook.answer`, the same answer `memento-sessions hook` prints. Anything the daemon
cannot answer (a malformed input, a backend away) is answered `{}`: the tool call goes on. A missing or
bad token is 401, which Claude Code treats as a non-blocking error.

`memento-sessions hook` posts here too, when its spool holds nothing but the input it just read: one round trip
that records and answers. It sends what its spool keeps with the input, so the events are the ones its
WebSocket delivery would send (ids and all, written once whichever path sends them): the time it read the
input (`X-Memento-Hook-At`), the project root (`X-Memento-Hook-Root`), and its claim TTL
(`X-Memento-Hook-Claim-Ttl`). The reply says whether the events were stored (`X-Memento-Hook-Recorded: 1`):
if not, the hook keeps the input in its spool for the WebSocket delivery.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Callable
from typing import Any

import pydantic_core
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from memento_sessions.auth import AuthError, Identity, bearer, session_agent, verify_token
from memento_sessions.coordination.answers import parse
from memento_sessions.coordination.methods import HookParams
from memento_sessions.errors import Conflict, NotFound, RateLimited, RpcError
from memento_sessions.ingest.claude_hooks import convert_hook
from memento_sessions.ingest.gemini_hooks import gemini_output, to_claude
from memento_sessions.limits import Buckets
from memento_sessions.logs import get_logger
from memento_sessions.rpc import Call, Registry, Result
from memento_sessions.sessions.manager import iso, now_ms

log = get_logger(__name__)
MAX_BODY = 4 * 1024 * 1024  # bytes of a hook input (as the command hook's MAX_INPUT)
BATCH = 200  # events per event.emitBatch
POLICY = "x-memento-hook-leases"  # optional header: the lease policy for this project (off, warn, enforce)
AT, ROOT, CLAIM_TTL = "x-memento-hook-at", "x-memento-hook-root", "x-memento-hook-claim-ttl"  # the command hook's
RECORDED = "x-memento-hook-recorded"
READ_AT = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z")  # as the command hook's spool writes it
ROOT_MAX = 4096  # characters of a project root (as hook.answer's `root`)
CLAIM_TTL_MAX = 3600
TOKENS_KEPT = 10_000  # verified tokens remembered (each a few hundred bytes; only tokens signed with the secret)


async def body_of(request: Request) -> Any:
    """The JSON body, or None when it is not JSON or longer than MAX_BODY (read no further)."""
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY:
                return None
            chunks.append(chunk)
    except ClientDisconnect:
        return None
    try:
        return pydantic_core.from_json(b"".join(chunks))
    except ValueError:
        return None


Family = tuple[Callable[[Any], Any], Callable[[dict[str, Any]], dict[str, Any]]]  # its input in, its output out
FAMILIES: dict[str, Family] = {"claude-code": (lambda record: record, lambda answer: answer),
                               "gemini-cli": (to_claude, gemini_output)}


class Tokens:
    """The identities of the tokens the hooks post with, each verified once: an agent's hook sends the same token
    with every tool call, and its HS256 check costs about 0.1 ms each time. A token serves from here until its
    `exp` (then it is verified again, and refused); only tokens that passed are kept, at most TOKENS_KEPT (the
    lot dropped past it)."""

    def __init__(self, secret: str) -> None:
        self.secret = secret
        self.known: dict[str, Identity] = {}

    def identity(self, token: str | None) -> Identity:
        """The token's identity; AuthError when it is missing, bad or expired."""
        known = self.known.get(token) if token else None
        if known is not None and known.expires_at is not None and time.time() < known.expires_at:
            return known
        identity = verify_token(self.secret, token)
        if len(self.known) >= TOKENS_KEPT:
            self.known.clear()
        self.known[str(token)] = identity
        return identity


def hook_routes(registry: Registry, secret: str, rate_limit: float = 0.0) -> list[Route]:
    """`POST /hooks/<agent>` for every agent family, one rate limit and one set of verified tokens for them all."""
    limits, tokens = Buckets(rate_limit) if rate_limit > 0 else None, Tokens(secret)
    return [Route(f"/hooks/{name}", hook_endpoint(registry, tokens, limits, family), methods=["POST"])
            for name, family in FAMILIES.items()]


def hook_endpoint(registry: Registry, tokens: Tokens, limits: Buckets | None, family: Family) -> Any:
    """The route's endpoint over the daemon's registry and verified tokens; with `limits` (MEMENTO_WS_RATE_LIMIT,
    as a /ws connection), each agent may post that many hook inputs a second (429 past it: an allow)."""
    convert, answer = family

    async def endpoint(request: Request) -> Response:
        try:
            identity = tokens.identity(bearer(request.headers.get("authorization")))
            if limits is not None:
                limits.take((identity.namespace, identity.agent_id))
        except AuthError as exc:
            return JSONResponse({"error": str(exc)}, status_code=401)
        except RateLimited as exc:
            return JSONResponse({"error": exc.message, **exc.data}, status_code=429)
        record = convert(await body_of(request))
        if parse(record, None) is None:  # malformed or unknown: counted there, allowed, nothing written
            return JSONResponse({})
        params, at, root = hook_params(request, record)
        recorded = [False]
        storing = asyncio.create_task(record_events(registry, identity, record, at, root, recorded))  # meanwhile
        try:
            result = await answered(registry, Call(identity), params)
        except RpcError as exc:  # a backend away, a token without the scope: the tool call goes on
            log.info("hook not answered", error=exc.message, agent_id=identity.agent_id)
            result = None
        finally:
            await storing
        return Response(pydantic_core.to_json({} if result is None else answer(result["output"])),
                        media_type="application/json", headers={RECORDED: "1" if recorded[0] else "0"})

    return endpoint


async def answered(registry: Registry, call: Call, params: dict[str, Any]) -> Result:
    """hook.answer's result, its params built without validation: hook_params checked each header, and the
    input is what the JSON parser made of the body (validating it again walked all of it: 2.2 ms for a 1.4 MB tool
    response, as long as parsing it). The method's scope is checked and its steps run as for any call."""
    method, _ = registry.resolve(call, "hook.answer", None, validated=False)
    return await registry.run(call, method, HookParams.model_construct(**params))


def hook_params(request: Request, record: Any) -> tuple[dict[str, Any], str, str | None]:
    """hook.answer's params, the time the input was read and the project root, from the request's headers
    (each ignored when it is not well formed: now, no root, the daemon's defaults)."""
    headers = request.headers
    params: dict[str, Any] = {"input": record}
    if headers.get(POLICY) in ("off", "warn", "enforce"):
        params["leases"] = headers[POLICY]
    root = headers.get(ROOT)
    if root is not None and 0 < len(root) <= ROOT_MAX:
        params["root"] = root
    else:
        root = None
    ttl = headers.get(CLAIM_TTL, "")
    if ttl.isdigit() and len(ttl) <= 4 and int(ttl) <= CLAIM_TTL_MAX:
        params["claimTtl"] = int(ttl)
    at = headers.get(AT, "")
    return params, at if READ_AT.fullmatch(at) else iso(now_ms()), root


async def record_events(registry: Registry, identity: Identity, record: dict[str, Any], at: str,
                        root: str | None = None, recorded: list[bool] | None = None) -> None:
    """The input's events in its session, as the session's agent (resumed, else created, when not live); a
    refusal is logged, never the hook's answer. `recorded[0]` set once they are all stored."""
    events, _ = convert_hook(record, at=at, project_root=root)
    sid = record["session_id"]
    call = Call(session_agent(identity, sid))
    try:
        for start in range(0, len(events), BATCH):
            await emit(registry, call, {"sessionId": sid, "events": events[start:start + BATCH]})
    except RpcError as exc:
        log.info("hook events not recorded", error=exc.message, session_id=sid if len(sid) <= 128 else None)
        return
    if recorded is not None:
        recorded[0] = True


async def emit(registry: Registry, call: Call, batch: dict[str, Any]) -> None:
    try:
        await registry.call(call, "event.emitBatch", batch)
        return
    except NotFound:
        pass
    try:
        await registry.call(call, "session.resume", {"sessionId": batch["sessionId"]})
    except NotFound:
        with contextlib.suppress(Conflict):  # created meanwhile by another hook
            await registry.call(call, "session.create", {"sessionId": batch["sessionId"]})
    except Conflict as exc:
        if not isinstance(exc.data, dict) or exc.data.get("reason") != "active":
            raise
    await registry.call(call, "event.emitBatch", batch)
