"""Usage in Redis: folded per session by the `memento_usage` Function, then added to the agent and namespace.

A session's runs and totals change in one Function call on the session's slot (library.py); the agent's and
the namespace's totals, on slots of their own, follow in one pipeline. Totals are kept per source (events,
otel, otel-metrics) because two sources may count the same calls: `totals_of` answers the one to trust.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from memento_sessions import keys
from memento_sessions.logs import get_logger
from memento_sessions.metrics import USAGE_COST, USAGE_TOKENS
from memento_sessions.settings import Settings
from memento_sessions.usage.fold import Op
from memento_sessions.usage.library import LIBRARY

log = get_logger(__name__)
SOURCES = ("otel", "otel-metrics", "events")  # most trusted first: the agent's own account of its calls
COUNTS = ("inputTokens", "outputTokens", "cacheReadTokens", "cacheCreationTokens", "toolCalls", "apiCalls",
          "durationMs", "runs", "costedRuns")
Folded = Literal["folded", "missing", "duplicate"]
SERIES_KEPT = 64  # cumulative metric series remembered per session (models x token types)


def totals_of(flat: Mapping[Any, Any]) -> dict[str, Any]:
    """`{totals, bySource}` from a totals hash: totals are the most trusted source's (zeros when none)."""
    by_source = {source: source_totals(flat, source) for source in SOURCES
                 if any(name.startswith(source + ":") for name in flat)}
    first = next(iter(by_source.values()), source_totals({}, ""))
    return {"totals": first, "bySource": by_source}


def source_totals(flat: Mapping[Any, Any], source: str) -> dict[str, Any]:
    """One source's totals; `costUsd` is null when the source gave no cost at all."""
    out: dict[str, Any] = {"source": source or None}
    for name in COUNTS:
        out[name] = int(flat.get(f"{source}:{name}", 0))
    cost = flat.get(f"{source}:costUsd")
    out["costUsd"] = round(float(cost), 9) if cost is not None else None
    out["costUnknownRuns"] = max(out["runs"] - out.pop("costedRuns"), 0)
    return out


TOKEN_TYPES = {"inputTokens": "input", "outputTokens": "output", "cacheReadTokens": "cache_read",
               "cacheCreationTokens": "cache_creation"}


class ModelLabels:
    """The model label of the usage metrics: the first `keep` models seen, then "other" (a bounded set)."""

    def __init__(self, keep: int) -> None:
        self.keep, self.seen = keep, set[str]()

    def __call__(self, model: str) -> str:
        model = model or "unknown"
        if model in self.seen:
            return model
        if len(self.seen) < self.keep:
            self.seen.add(model)
            return model
        return "other"

    def count(self, model: str, source: str, fields: dict[str, float]) -> None:
        """Add one model's applied usage to the Prometheus totals."""
        label = self(model)
        for field, kind in TOKEN_TYPES.items():
            if fields.get(field, 0) > 0:
                USAGE_TOKENS.labels(label, source, kind).inc(fields[field])
        if fields.get("costUsd", 0) > 0:
            USAGE_COST.labels(label, source).inc(fields["costUsd"])


class UsageStore:
    """Writes usage ops and reads totals and runs, for every namespace."""

    def __init__(self, redis: aioredis.Redis, settings: Settings) -> None:
        self.redis, self.settings = redis, settings
        self.labels = ModelLabels(settings.usage_metric_models)
        self.loaded = False  # loaded on first use, not at start: a daemon starts while Redis is down

    async def load(self) -> None:
        """(Re)load the Function library; REPLACE makes this safe for every daemon, whichever version Redis had."""
        await self.redis.function_load(LIBRARY, replace=True)
        self.loaded = True

    async def fold(self, ns: str, session_id: str, agent_id: str, source: str, ops: Sequence[Op],
                   request: str = "") -> Folded:
        """Fold ops into a session's usage and its agent's and namespace's totals: "missing" when the session
        does not exist (its ops then count for the agent and namespace alone), "duplicate" when `request` (an
        OTLP request's id) was folded into it within MEMENTO_OTLP_DEDUPE_WINDOW seconds (nothing is added)."""
        if not ops:
            return "folded"
        skeys, ukeys = keys.session_keys(ns, session_id), keys.usage_keys(ns, session_id)
        window = self.settings.otlp_dedupe_window * 1000 if request else 0
        args = [source, self.settings.usage_runs_per_session, self.settings.usage_ttl * 1000, SERIES_KEPT,
                json.dumps(list(ops), separators=(",", ":")), agent_id, self.settings.usage_agents_per_session,
                request if window else "", int(time.time() * 1000), window, self.settings.otlp_dedupe_requests]
        raw = await self._fcall([skeys.session, *ukeys.all()], args)
        applied = json.loads(raw) if raw else {"applied": naive(ops), "new": []}
        if applied.get("duplicate"):
            return "duplicate"
        await self._spread(ns, session_id, agent_id, source, applied)
        return "folded" if raw else "missing"

    async def unattached(self, ns: str, agent_id: str, source: str, ops: Sequence[Op]) -> None:
        """Ops that name no session: they count for the agent and the namespace alone."""
        if ops:
            await self._spread(ns, "", agent_id, source, {"applied": naive(ops), "new": []})

    async def _fcall(self, fkeys: list[str], args: list[Any]) -> Any:
        if not self.loaded:
            await self.load()
        try:
            return await self.redis.fcall("mu_fold", len(fkeys), *fkeys, *args)
        except ResponseError as exc:
            if "Function not found" not in str(exc):
                raise
        log.warning("redis lost the usage library; reloading")
        await self.load()
        return await self.redis.fcall("mu_fold", len(fkeys), *fkeys, *args)

    async def _spread(self, ns: str, session_id: str, agent_id: str, source: str, applied: dict[str, Any]) -> None:
        """Add what the session took to its agent's and namespace's totals, and to the metrics."""
        by_model: dict[str, dict[str, float]] = applied.get("applied") or {}
        fresh: list[list[Any]] = applied.get("new") or []
        agent_totals, agent_runs = keys.agent_usage_keys(ns, agent_id)
        ns_totals, ttl = keys.namespace_usage(ns), self.settings.usage_ttl
        async with self.redis.pipeline(transaction=False) as pipe:
            for model, fields in by_model.items():
                self.labels.count(model, source, fields)
                for field, delta in fields.items():
                    name = f"{source}:{field}"
                    for key in (agent_totals, ns_totals):
                        if field == "costUsd":
                            pipe.hincrbyfloat(key, name, delta)
                        else:
                            pipe.hincrby(key, name, int(delta))
            if fresh:
                pipe.zadd(agent_runs, {f"{session_id} {run_id}": at for run_id, at in fresh})
                pipe.zremrangebyrank(agent_runs, 0, -self.settings.usage_runs_per_agent - 1)
            for key in (agent_totals, agent_runs, ns_totals):
                pipe.expire(key, ttl)
            await pipe.execute()


def naive(ops: Sequence[Op]) -> dict[str, dict[str, float]]:
    """What `add` ops add up to without a session to fold into (cumulative points need the session's)."""
    out: dict[str, dict[str, float]] = {}
    names = {"in": "inputTokens", "out": "outputTokens", "cr": "cacheReadTokens", "cc": "cacheCreationTokens",
             "tools": "toolCalls", "calls": "apiCalls", "cost": "costUsd"}
    for op in ops:
        if op.get("op") != "add":
            continue
        fields = out.setdefault(str(op.get("model") or ""), {})
        for short, name in names.items():
            if op.get(short):
                fields[name] = fields.get(name, 0) + op[short]
    return out
