"""OTLP export requests (logs and metrics) as usage ops by session, decoded with the official definitions.

Bodies are decoded by `opentelemetry-proto` (protobuf) or protobuf's json_format (the OTLP JSON encoding,
whose trace and span ids are hex, not base64: they are dropped before parsing, nothing here reads them).
Taken from logs: Claude Code's `claude_code.user_prompt` (a run opens) and `claude_code.api_request`
events (model, cost_usd, input_tokens, output_tokens, cache_read_tokens, cache_creation_tokens, prompt.id)
and any record carrying the GenAI conventions' `gen_ai.usage.*`. From metrics: `claude_code.token.usage` and
`claude_code.cost.usage` (sums, delta or cumulative) and `gen_ai.client.token.usage` (a histogram's sum).
`session.id` (or `gen_ai.conversation.id`) names the session; `prompt.id` the run. Anything else is counted
and ignored.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format  # type: ignore[import-untyped]
from google.protobuf.message import DecodeError, Message  # type: ignore[import-untyped]
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from memento_sessions.usage.fold import Op, count, model_of, money

SESSION_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}\Z")
API_REQUEST, USER_PROMPT = "claude_code.api_request", "claude_code.user_prompt"
CLAUDE_TOKENS = {"input_tokens": "in", "output_tokens": "out", "cache_read_tokens": "cr", "cache_creation_tokens": "cc"}
GENAI_TOKENS = {"gen_ai.usage.input_tokens": "in", "gen_ai.usage.output_tokens": "out"}
TOKEN_TYPES = {"input": "inputTokens", "output": "outputTokens", "cacheRead": "cacheReadTokens",
               "cacheCreation": "cacheCreationTokens"}
CUMULATIVE = 2  # AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
MAX_DEPTH = 64  # nesting of a JSON body walked to drop its hex ids
MAX_SESSIONS = 100  # distinct sessions one request may write to; records of more are ignored and counted


class BadBody(ValueError):
    """The body is not an OTLP export request of this signal (400, nothing written)."""


@dataclass
class Batch:
    """One request's ops by session id (None: no session named), and what was ignored, by reason."""

    ops: dict[str | None, list[Op]] = field(default_factory=dict)
    records: int = 0
    ignored: Counter[str] = field(default_factory=Counter)

    def add(self, session_id: str | None, op: Op) -> None:
        if session_id is not None and session_id not in self.ops and len(self.ops) >= MAX_SESSIONS:
            self.ignored["too_many_sessions"] += 1
            return
        self.ops.setdefault(session_id, []).append(op)


def decode(body: bytes, as_json: bool, message: Message) -> None:
    """Parse `body` into `message` (protobuf or OTLP JSON); BadBody when it is not one."""
    try:
        if as_json:
            json_format.ParseDict(without_ids(json.loads(body)), message, ignore_unknown_fields=True)
        else:
            message.ParseFromString(body)
    except (DecodeError, json_format.ParseError, ValueError, TypeError, RecursionError) as exc:
        raise BadBody(f"not an OTLP {type(message).__name__}: {str(exc)[:200]}") from None


def without_ids(value: Any, depth: int = 0) -> Any:
    """A JSON body without `traceId` and `spanId` (hex in OTLP JSON, which json_format would read as base64)."""
    if depth > MAX_DEPTH:
        raise BadBody("the body nests too deep")
    if isinstance(value, dict):
        return {k: without_ids(v, depth + 1) for k, v in value.items() if k not in ("traceId", "spanId")}
    if isinstance(value, list):
        return [without_ids(v, depth + 1) for v in value]
    return value


def plain(value: AnyValue) -> Any:
    """An attribute's value as Python (only scalars are read here)."""
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind in ("string_value", "int_value", "double_value", "bool_value") else None


def attributes(*groups: Iterable[KeyValue]) -> dict[str, Any]:
    """Attributes of a resource and a record as one dict, the record's winning."""
    return {kv.key: plain(kv.value) for group in groups for kv in group}


def number(value: Any) -> float | None:
    """A number an exporter may send as a string (Claude Code does)."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def session_of(attrs: dict[str, Any]) -> str | None:
    """The session a record or point belongs to: `session.id`, else `gen_ai.conversation.id`."""
    for name in ("session.id", "gen_ai.conversation.id"):
        value = attrs.get(name)
        if isinstance(value, str) and SESSION_ID.match(value):
            return value
    return None


def millis(nanos: int) -> int:
    """Epoch milliseconds of epoch nanoseconds; now when the exporter sent none."""
    return nanos // 1_000_000 if nanos > 0 else int(time.time() * 1000)


def log_batch(body: bytes, as_json: bool, max_records: int) -> Batch:
    """The usage ops of an ExportLogsServiceRequest; BadBody for a malformed or oversized one."""
    request = ExportLogsServiceRequest()
    decode(body, as_json, request)
    batch = Batch()
    for resource_logs in request.resource_logs:
        for scope_logs in resource_logs.scope_logs:
            batch.records += len(scope_logs.log_records)
            if batch.records > max_records:
                raise BadBody(f"more than {max_records} log records (MEMENTO_OTLP_MAX_RECORDS)")
            for record in scope_logs.log_records:
                attrs = attributes(resource_logs.resource.attributes, record.attributes)
                op = api_request(record, attrs)
                if op is None:
                    batch.ignored["not_usage"] += 1
                else:
                    batch.add(session_of(attrs), op)
    return batch


def api_request(record: Any, attrs: dict[str, Any]) -> Op | None:
    """The op of one Claude Code api_request event or GenAI usage record, else None."""
    names = {record.event_name, record.body.string_value, str(attrs.get("event.name"))}
    at, prompt = millis(record.time_unix_nano or record.observed_time_unix_nano), attrs.get("prompt.id")
    prompt = prompt if isinstance(prompt, str) and SESSION_ID.match(prompt) else None
    if (USER_PROMPT in names or "user_prompt" in names) and prompt:
        return {"op": "add", "run": prompt, "at": at}  # the run opens when the prompt was typed
    if API_REQUEST in names or "api_request" in names:
        tokens = CLAUDE_TOKENS
    elif any(name in attrs for name in GENAI_TOKENS):
        tokens = GENAI_TOKENS
    else:
        return None
    op: Op = {"op": "add", "calls": 1, "at": at}
    for name, short in tokens.items():
        op[short] = count(number(attrs.get(name)))
    model = model_of(attrs.get("model") or attrs.get("gen_ai.response.model") or attrs.get("gen_ai.request.model"))
    if model:
        op["model"] = model
    if (cost := money(number(attrs.get("cost_usd")))) is not None:
        op["cost"] = cost
    if prompt:
        op["run"] = prompt
    return op


def metric_batch(body: bytes, as_json: bool, max_points: int) -> Batch:
    """The usage ops of an ExportMetricsServiceRequest; BadBody for a malformed or oversized one."""
    request = ExportMetricsServiceRequest()
    decode(body, as_json, request)
    batch = Batch()
    for resource_metrics in request.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                for session_id, op in metric_ops(metric, resource_metrics.resource.attributes, batch):
                    if batch.records > max_points:
                        raise BadBody(f"more than {max_points} metric points (MEMENTO_OTLP_MAX_RECORDS)")
                    batch.add(session_id, op)
    return batch


def metric_ops(metric: Any, resource: Iterable[KeyValue], batch: Batch) -> Iterator[tuple[str | None, Op]]:
    """(session id, op) of each data point of a usage metric; other metrics' points counted as ignored."""
    kind = metric.WhichOneof("data")
    data = getattr(metric, kind) if kind in ("sum", "histogram") else None
    if data is None or metric.name not in ("claude_code.token.usage", "claude_code.cost.usage",
                                           "gen_ai.client.token.usage"):
        batch.records += len(data.data_points) if data is not None else 0
        batch.ignored["not_usage"] += len(data.data_points) if data is not None else 0
        return
    for point in data.data_points:
        batch.records += 1
        attrs = attributes(resource, point.attributes)
        value = point.sum if kind == "histogram" else (point.as_double if point.HasField("as_double")
                                                       else point.as_int)
        found = point_field(metric.name, attrs)
        if found is None or value < 0:
            batch.ignored["not_usage"] += 1
            continue
        model = model_of(attrs.get("model") or attrs.get("gen_ai.response.model") or attrs.get("gen_ai.request.model"))
        yield session_of(attrs), point_op(found, value, model, data.aggregation_temporality == CUMULATIVE,
                                          f"{metric.name}|{model}|{found}|{point.start_time_unix_nano}")


def point_field(name: str, attrs: dict[str, Any]) -> str | None:
    """The usage field a data point counts: costUsd, or a token type."""
    if name == "claude_code.cost.usage":
        return "costUsd"
    kind = attrs.get("type") if name == "claude_code.token.usage" else attrs.get("gen_ai.token.type")
    return TOKEN_TYPES.get(str(kind))


def point_op(field_name: str, value: float, model: str | None, cumulative: bool, series: str) -> Op:
    """A delta point adds; a cumulative one is turned into its change by the session's Function."""
    short = {"inputTokens": "in", "outputTokens": "out", "cacheReadTokens": "cr", "cacheCreationTokens": "cc",
             "costUsd": "cost"}[field_name]
    amount: float = (money(value) or 0.0) if field_name == "costUsd" else count(value)
    op: Op = ({"op": "cum", "series": series[:300], "value": amount, "field": field_name} if cumulative
              else {"op": "add", short: amount})
    if model:
        op["model"] = model
    return op
