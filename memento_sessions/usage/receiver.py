"""`POST /v1/logs` and `POST /v1/metrics`: OTLP/HTTP on the daemon's port, so agents export their usage to it.

As for /ws, the bearer token names the agent and the namespace (scope sessions:write). A request is read
whole (at most MEMENTO_OTLP_MAX_BODY bytes, gzip included once inflated) and decoded whole before anything
is written: a malformed body is a 400 that writes nothing. Each agent has MEMENTO_OTLP_RATE_LIMIT requests
a second (429 with Retry-After past it). A Redis failure is a 503, which OTLP exporters retry; a refusal
of the Function a 500, which they do not. A request is known by a hash of its agent, signal and (inflated)
body: a session that folded it within MEMENTO_OTLP_DEDUPE_WINDOW seconds does not fold it again.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Callable

from redis.exceptions import ResponseError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from memento_sessions.auth import Identity, bearer, session_agent, verify_token
from memento_sessions.backends import UNAVAILABLE
from memento_sessions.errors import AuthError, Forbidden, RateLimited
from memento_sessions.limits import Buckets
from memento_sessions.logs import get_logger
from memento_sessions.metrics import OTLP_RECORDS, OTLP_REQUESTS
from memento_sessions.settings import Settings
from memento_sessions.usage.otlp import BadBody, Batch, log_batch, metric_batch
from memento_sessions.usage.store import UsageStore

log = get_logger(__name__)
PROTOBUF, JSON = "application/x-protobuf", "application/json"
Decoder = Callable[[bytes, bool, int], Batch]
SIGNALS: dict[str, tuple[Decoder, str]] = {"logs": (log_batch, "otel"), "metrics": (metric_batch, "otel-metrics")}


class Refused(Exception):
    """A request answered with an HTTP error and nothing written."""

    def __init__(self, status: int, outcome: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.outcome, self.headers = status, outcome, headers or {}


class OtlpReceiver:
    """The two routes, over the usage store; one token bucket per agent."""

    def __init__(self, store: UsageStore, settings: Settings, secret: str) -> None:
        self.store, self.settings, self.secret = store, settings, secret
        self.buckets = Buckets(settings.otlp_rate_limit) if settings.otlp_rate_limit > 0 else None

    def routes(self) -> list[Route]:
        """`/v1/logs` and `/v1/metrics`, POST only."""
        return [Route(f"/v1/{signal}", self.endpoint(signal), methods=["POST"]) for signal in SIGNALS]

    def endpoint(self, signal: str) -> Callable[[Request], object]:
        async def receive(request: Request) -> Response:
            try:
                return await self.take(signal, request)
            except Refused as refused:
                OTLP_REQUESTS.labels(signal, refused.outcome).inc()
                return Response(str(refused), refused.status, headers=refused.headers, media_type="text/plain")
        return receive

    async def take(self, signal: str, request: Request) -> Response:
        """Check, read and decode the whole request, then write its usage; the OTLP success reply."""
        who = self.identity(request)
        as_json = encoding(request.headers.get("content-type", ""))
        body = inflate(await self.body(request), request.headers.get("content-encoding", ""),
                       self.settings.otlp_max_body)
        decoder, source = SIGNALS[signal]
        try:
            batch = decoder(body, as_json, self.settings.otlp_max_records)
        except BadBody as exc:
            raise Refused(400, "bad_request", str(exc)) from None
        request_id = hashlib.sha256(f"{signal} {who.agent_id} ".encode() + body).hexdigest()[:32]
        await self.write(who, source, batch, request_id)
        OTLP_REQUESTS.labels(signal, "ok").inc()
        OTLP_RECORDS.labels(signal, "taken").inc(batch.records - sum(batch.ignored.values()))
        for reason, n in batch.ignored.items():
            OTLP_RECORDS.labels(signal, reason).inc(n)
        return Response(b"{}" if as_json else b"", media_type=JSON if as_json else PROTOBUF)

    def identity(self, request: Request) -> Identity:
        """The caller of a valid token with sessions:write, within its agent's rate; else a Refused."""
        try:
            who = verify_token(self.secret, bearer(request.headers.get("authorization")))
            who.require("sessions:write")
        except AuthError as exc:
            raise Refused(401, "unauthorized", str(exc), {"WWW-Authenticate": "Bearer"}) from None
        except Forbidden as exc:
            raise Refused(403, "unauthorized", exc.message) from None
        try:
            if self.buckets is not None:
                self.buckets.take((who.namespace, who.agent_id))
        except RateLimited as exc:
            seconds = str(max(1, exc.data["retryAfterMs"] // 1000))
            raise Refused(429, "rate_limited", "rate limited", {"Retry-After": seconds}) from None
        return who

    async def body(self, request: Request) -> bytes:
        """The body, refused past MEMENTO_OTLP_MAX_BODY whether or not Content-Length says so."""
        limit = self.settings.otlp_max_body
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise Refused(413, "too_large", f"body over {limit} bytes (MEMENTO_OTLP_MAX_BODY)")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise Refused(413, "too_large", f"body over {limit} bytes (MEMENTO_OTLP_MAX_BODY)")
            chunks.append(chunk)
        return b"".join(chunks)

    async def write(self, who: Identity, source: str, batch: Batch, request_id: str) -> None:
        """Each session's ops in one Function call; ops naming no session count for the agent alone. A session
        that folded `request_id` lately (the exporter retries a request whose reply it lost, or a 503 after some
        sessions were written) takes nothing again."""
        try:
            for session_id, ops in batch.ops.items():
                if session_id is None:
                    await self.store.unattached(who.namespace, who.agent_id, source, ops)
                else:  # a Claude Code session is its own agent of the token, as its hook's events are
                    agent = session_agent(who, session_id).agent_id
                    folded = await self.store.fold(who.namespace, session_id, agent, source, ops, request_id)
                    if folded != "folded":
                        batch.ignored["unknown_session" if folded == "missing" else "duplicate"] += len(ops)
        except UNAVAILABLE as exc:
            log.warning("OTLP usage not stored; the exporter retries", error=repr(exc))
            raise Refused(503, "unavailable", "backend unavailable: Redis", {"Retry-After": "1"}) from None
        except ResponseError as exc:  # the Function refused (a counter at its end): a retry would fail alike
            log.warning("OTLP usage not stored", agent_id=who.agent_id, error=str(exc)[:200])
            raise Refused(500, "failed", "usage not stored") from None


def encoding(content_type: str) -> bool:
    """True for OTLP JSON, False for protobuf; 415 for anything else."""
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind not in (PROTOBUF, JSON):
        raise Refused(415, "unsupported", f"Content-Type must be {PROTOBUF} or {JSON}")
    return kind == JSON


def inflate(body: bytes, content_encoding: str, limit: int) -> bytes:
    """The body as sent, or gzip-inflated to at most `limit` bytes."""
    kind = content_encoding.strip().lower()
    if kind in ("", "identity"):
        return body
    if kind != "gzip":
        raise Refused(415, "unsupported", "Content-Encoding must be gzip or none")
    inflater = zlib.decompressobj(wbits=31)
    try:
        out = inflater.decompress(body, limit)
    except zlib.error:
        raise Refused(400, "bad_request", "the body is not gzip") from None
    if inflater.unconsumed_tail:
        raise Refused(413, "too_large", f"body over {limit} bytes inflated (MEMENTO_OTLP_MAX_BODY)")
    return out
