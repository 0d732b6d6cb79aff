"""The OTLP/HTTP receiver against the real daemon: a recorded export of Claude Code's shape (protobuf and
JSON) joined to the session the hook created; cumulative and delta metrics; bad bodies get 400 and write
nothing; every bound (token, size, rate, content type); another namespace sees nothing; Prometheus totals."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from google.protobuf import json_format  # type: ignore[import-untyped]
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from structlog.testing import capture_logs

from memento_sessions import keys
from memento_sessions.backends import Backends
from memento_sessions.client import Client
from memento_sessions.endpoints import Endpoints
from memento_sessions.server.daemon import Daemon, running
from tests.helpers import make_settings, sample, token
from tests.test_hook import HOOK
from tests.test_ingest_convert import FIXTURES
from tests.test_ingest_daemon import url

pytestmark = pytest.mark.anyio
LOGS = FIXTURES / "claude_code_otlp_logs.json"
SESSION = "d6e0bada-5f3b-4c1e-9f0e-2b7c8a1d4e21"
AGENT = "claude:d6e0bada"  # the Claude Code session's own agent of the token `claude`, for its hook and its telemetry
PROTOBUF, JSON = {"content-type": "application/x-protobuf"}, {"content-type": "application/json"}
TOKENS = {"input_tokens": "inputTokens", "output_tokens": "outputTokens", "cache_read_tokens": "cacheReadTokens",
          "cache_creation_tokens": "cacheCreationTokens"}


def expected_runs(path: Path) -> dict[str, dict[str, Any]]:
    """Per prompt.id, the sums of the api_request events of the export, read from the file itself."""
    runs: dict[str, dict[str, Any]] = defaultdict(lambda: {**dict.fromkeys(TOKENS.values(), 0), "costUsd": 0.0,
                                                           "apiCalls": 0})
    for record in json.loads(path.read_text())["resourceLogs"][0]["scopeLogs"][0]["logRecords"]:
        attrs = {kv["key"]: next(iter(kv["value"].values())) for kv in record["attributes"]}
        if attrs["event.name"] != "api_request":
            continue
        run = runs[attrs["prompt.id"]]
        for name, field in TOKENS.items():
            run[field] += int(attrs[name])
        run["costUsd"] += float(attrs["cost_usd"])
        run["apiCalls"] += 1
        run["model"] = attrs["model"]
    return dict(runs)


def protobuf_logs(path: Path = LOGS) -> bytes:
    return bytes(json_format.Parse(path.read_text(), ExportLogsServiceRequest()).SerializeToString())


async def post(daemon: Daemon, signal: str, body: bytes, headers: dict[str, str], tok: str | None) -> httpx2.Response:
    auth = {"authorization": f"Bearer {tok}"} if tok else {}
    async with httpx2.AsyncClient() as http:
        return await http.post(f"http://127.0.0.1:{daemon.port}/v1/{signal}", content=body,
                               headers={**headers, **auth})


def hook_session(daemon: Daemon, namespace: str) -> None:
    """The session Claude Code's hook creates: named by its session_id, the id its telemetry carries."""
    env = {**os.environ, "MEMENTO_DATA_DIR": str(daemon.settings.data_dir), "MEMENTO_TOKEN": token("claude", namespace),
           "MEMENTO_URL": url(daemon)}
    prompt = {"session_id": SESSION, "transcript_path": "/tmp/t.jsonl", "cwd": "/repo",
              "hook_event_name": "UserPromptSubmit", "prompt": "start phoenix in background"}
    done = subprocess.run(HOOK, input=json.dumps(prompt).encode(), env=env, capture_output=True, timeout=30,
                          check=False)
    assert done.returncode == 0, done.stderr
    # A hook past its time budget spools the input for its next call (a loaded host): deliver it now, as the
    # next call would (exit 0: nothing left).
    flushed = subprocess.run([*HOOK, "--flush"], env=env, capture_output=True, timeout=60, check=False)
    assert flushed.returncode == 0, flushed.stderr


async def usage(daemon: Daemon, namespace: str, **params: Any) -> dict[str, Any]:
    async with Client(url(daemon), token("reader", namespace), reconnect=False) as client:
        result: dict[str, Any] = await client.call("usage.get", params)
        return result


@pytest.mark.parametrize("encoding", ["protobuf", "json", "gzip"])
async def test_claude_code_export_lands_in_the_hook_session_per_prompt(daemon: Daemon, namespace: str,
                                                                        encoding: str) -> None:
    await anyio.to_thread.run_sync(hook_session, daemon, namespace)
    body, headers = (LOGS.read_bytes(), JSON) if encoding == "json" else (protobuf_logs(), PROTOBUF)
    if encoding == "gzip":
        body, headers = gzip.compress(body), {**headers, "content-encoding": "gzip"}
    before = sample("memento_usage_tokens_total", {"model": "claude-haiku-4-5", "source": "otel", "type": "input"})
    reply = await post(daemon, "logs", body, headers, token("claude", namespace))
    assert reply.status_code == 200 and reply.headers["content-type"].startswith(headers["content-type"])
    expected = expected_runs(LOGS)
    got = await usage(daemon, namespace, sessionId=SESSION)
    rows = {row["runId"]: row for row in got["runs"] if row["source"] == "otel"}
    [hooked] = [row for row in got["runs"] if row["source"] == "events"]  # the hook's prompt: a run, no tokens
    assert set(rows) == set(expected) and hooked["inputTokens"] == 0 and got["bySource"]["events"]["runs"] == 1
    for prompt, run in expected.items():
        assert {key: rows[prompt][key] for key in run} == pytest.approx(run)
    first = rows["0b6f3a52-1c2d-4e5f-8a9b-0c1d2e3f4a5b"]
    assert first["startedAt"] == "2026-02-10T22:57:54.684Z" and first["durationMs"] == 82040 - 74684  # prompt to last
    totals = got["totals"]
    assert totals["source"] == "otel" and totals["runs"] == 2 and totals["costUnknownRuns"] == 0
    assert totals["costUsd"] == pytest.approx(sum(run["costUsd"] for run in expected.values()))
    assert totals["cacheReadTokens"] == 17915 + 25798 and totals["apiCalls"] == 3
    agent = await usage(daemon, namespace, agentId=AGENT)
    assert agent["totals"] == totals and len(agent["runs"]) == 3  # the hook and the telemetry are one agent
    after = sample("memento_usage_tokens_total", {"model": "claude-haiku-4-5", "source": "otel", "type": "input"})
    assert after - before == 350


def metrics_body(points: list[tuple[str, str | None, float]], cumulative: bool) -> dict[str, Any]:
    """An OTLP JSON metrics export of Claude Code's shape: (metric name, token type, value) per point."""
    def point(name: str, kind: str | None, value: float) -> dict[str, Any]:
        attrs = [{"key": "session.id", "value": {"stringValue": SESSION}},
                 {"key": "model", "value": {"stringValue": "claude-opus-4-6"}}]
        if kind:
            attrs.append({"key": "type", "value": {"stringValue": kind}})
        number = {"asDouble": value} if name.endswith("cost.usage") else {"asInt": str(int(value))}
        return {"startTimeUnixNano": "1770764274000000000", "timeUnixNano": "1770764334000000000",
                "attributes": attrs, **number}
    by_name: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for name, kind, value in points:
        by_name[name].append(point(name, kind, value))
    metrics = [{"name": name, "unit": "USD" if name.endswith("cost.usage") else "tokens",
                "sum": {"dataPoints": data, "aggregationTemporality": 2 if cumulative else 1, "isMonotonic": True}}
               for name, data in by_name.items()]
    return {"resourceMetrics": [{"resource": {"attributes": [{"key": "service.name",
                                                               "value": {"stringValue": "claude-code"}}]},
                                 "scopeMetrics": [{"scope": {"name": "com.anthropic.claude_code"},
                                                   "metrics": metrics}]}]}


async def test_metrics_cumulative_points_count_their_change_and_delta_points_add(daemon: Daemon,
                                                                                 namespace: str) -> None:
    await anyio.to_thread.run_sync(hook_session, daemon, namespace)
    tok = token("claude", namespace)
    exports = [metrics_body([("claude_code.token.usage", "input", 100), ("claude_code.token.usage", "output", 10),
                             ("claude_code.cost.usage", None, 0.5)], cumulative=True),
               metrics_body([("claude_code.token.usage", "input", 160), ("claude_code.token.usage", "output", 25),
                             ("claude_code.cost.usage", None, 0.75), ("claude_code.session.count", None, 1)],
                            cumulative=True),
               metrics_body([("claude_code.token.usage", "cacheRead", 7)], cumulative=False),
               metrics_body([("claude_code.token.usage", "cacheRead", 5)], cumulative=False)]
    for n, export in enumerate(exports):
        body = json.dumps(export).encode()
        if n % 2:  # the same request as protobuf
            body = bytes(json_format.Parse(body, ExportMetricsServiceRequest()).SerializeToString())
        reply = await post(daemon, "metrics", body, PROTOBUF if n % 2 else JSON, tok)
        assert reply.status_code == 200, reply.text
    got = await usage(daemon, namespace, sessionId=SESSION)
    totals = got["totals"]
    assert totals["source"] == "otel-metrics"
    assert [row["source"] for row in got["runs"]] == ["events"]  # the hook's prompt: metrics give totals, not runs
    assert (totals["inputTokens"], totals["outputTokens"], totals["cacheReadTokens"]) == (160, 25, 12)
    assert totals["costUsd"] == pytest.approx(0.75)


async def test_malformed_bodies_get_400_and_write_nothing(daemon: Daemon, namespace: str) -> None:
    await anyio.to_thread.run_sync(hook_session, daemon, namespace)
    tok = token("claude", namespace)
    good = json.loads(LOGS.read_text())
    broken_json = {**good, "resourceLogs": [{"scopeLogs": "not a list"}]}
    wrong_type = {"resourceLogs": [{"scopeLogs": [{"logRecords": [{"timeUnixNano": "soon"}]}]}]}
    for body, headers in [(b"\xff\xff\xff\xff", PROTOBUF), (protobuf_logs()[:-7], PROTOBUF), (b"{not json", JSON),
                          (json.dumps(broken_json).encode(), JSON), (json.dumps(wrong_type).encode(), JSON),
                          (b"[1, 2]", JSON), (gzip.compress(b"x")[:-3] + b"zzz", {**JSON, "content-encoding": "gzip"})]:
        reply = await post(daemon, "logs", body, headers, tok)
        assert reply.status_code == 400, (body[:40], reply.status_code, reply.text)
    reply = await post(daemon, "metrics", b"\x0a\xff", PROTOBUF, tok)
    assert reply.status_code == 400
    got = await usage(daemon, namespace, sessionId=SESSION)
    spend = await usage(daemon, namespace)
    assert list(got["bySource"]) == list(spend["bySource"]) == ["events"]  # the hook's prompt alone
    assert [row["source"] for row in got["runs"]] == ["events"] and got["totals"]["inputTokens"] == 0


async def test_token_type_size_and_rate_are_bounded(backend_urls: Endpoints, tmp_path: Path, namespace: str) -> None:
    settings = make_settings(backend_urls, tmp_path, otlp_max_body=4096, otlp_rate_limit=2.0, otlp_max_records=3)
    async with running(settings) as daemon:
        await anyio.to_thread.run_sync(hook_session, daemon, namespace)
        body = LOGS.read_bytes()  # 5 records, over 4096 bytes
        assert (await post(daemon, "logs", body, JSON, None)).status_code == 401
        assert (await post(daemon, "logs", body, JSON, "forged")).status_code == 401
        reader = token("claude", namespace, scope="sessions:read")
        assert (await post(daemon, "logs", body, JSON, reader)).status_code == 403
        tok = token("claude", namespace)
        assert (await post(daemon, "logs", body, {"content-type": "text/plain"}, tok)).status_code == 415
        assert (await post(daemon, "logs", body, JSON, tok)).status_code == 413
        await anyio.sleep(1.1)  # the bucket refills
        small = protobuf_logs()  # under 4096 bytes, but 5 records: over MEMENTO_OTLP_MAX_RECORDS
        assert len(small) < 4096 and (await post(daemon, "logs", small, PROTOBUF, tok)).status_code == 400
        bomb = gzip.compress(b"\x00" * 100_000)  # small on the wire, large inflated
        assert (await post(daemon, "logs", bomb, {**PROTOBUF, "content-encoding": "gzip"}, tok)).status_code == 413
        statuses = [(await post(daemon, "logs", b"", PROTOBUF, tok)).status_code for _ in range(5)]
        assert statuses.count(429) >= 2 and set(statuses) <= {200, 429}
        async with httpx2.AsyncClient() as http:
            assert (await http.get(f"http://127.0.0.1:{daemon.port}/v1/logs")).status_code == 405
        assert list((await usage(daemon, namespace, sessionId=SESSION))["bySource"]) == ["events"]


async def test_another_namespace_sees_nothing(daemon: Daemon, namespace: str) -> None:
    await anyio.to_thread.run_sync(hook_session, daemon, namespace)
    other = namespace + "x"
    reply = await post(daemon, "logs", LOGS.read_bytes(), JSON, token("claude", other))
    assert reply.status_code == 200  # the other namespace has no such session: its agent's totals alone
    for mine in (await usage(daemon, namespace, sessionId=SESSION), await usage(daemon, namespace),
                 await usage(daemon, namespace, agentId=AGENT)):
        assert list(mine["bySource"]) == ["events"] and mine["totals"]["inputTokens"] == 0  # the hook's alone
    theirs = await usage(daemon, other, agentId=AGENT)
    assert theirs["totals"]["inputTokens"] == 3 + 1 + 350 and theirs["runs"] == []


async def test_a_refused_fold_is_a_500_logged_without_a_traceback(daemon: Daemon, namespace: str,
                                                                  backends: Backends) -> None:
    await anyio.to_thread.run_sync(hook_session, daemon, namespace)
    totals = keys.usage_keys(namespace, SESSION).totals
    await backends.redis.hset(totals, "otel:inputTokens", str(2**63 - 10))  # the next add overflows in Redis
    with capture_logs() as logs:
        reply = await post(daemon, "logs", LOGS.read_bytes(), JSON, token("claude", namespace))
    assert reply.status_code == 500 and reply.text == "usage not stored"
    assert [entry["log_level"] for entry in logs if entry["event"].startswith("OTLP")] == ["warning"]
    assert not [entry for entry in logs if entry["log_level"] in ("error", "exception")]


async def test_genai_token_histograms_count_input_and_output_apart(daemon: Daemon, namespace: str) -> None:
    await anyio.to_thread.run_sync(hook_session, daemon, namespace)

    def export(input_sum: int, output_sum: int) -> bytes:
        points = [{"startTimeUnixNano": "1770764274000000000", "timeUnixNano": "1770764334000000000", "count": "2",
                   "sum": value, "attributes": [{"key": "gen_ai.conversation.id", "value": {"stringValue": SESSION}},
                                                {"key": "gen_ai.request.model", "value": {"stringValue": "gpt-x"}},
                                                {"key": "gen_ai.token.type", "value": {"stringValue": kind}}]}
                  for kind, value in (("input", input_sum), ("output", output_sum))]
        metric = {"name": "gen_ai.client.token.usage", "unit": "{token}",
                  "histogram": {"dataPoints": points, "aggregationTemporality": 2}}
        body = {"resourceMetrics": [{"scopeMetrics": [{"metrics": [metric]}]}]}
        return json.dumps(body).encode()

    for sums in ((300, 40), (500, 70)):  # cumulative: the second export holds the first
        assert (await post(daemon, "metrics", export(*sums), JSON, token("agent", namespace))).status_code == 200
    totals = (await usage(daemon, namespace, sessionId=SESSION))["bySource"]["otel-metrics"]
    assert (totals["inputTokens"], totals["outputTokens"], totals["costUsd"]) == (500, 70, None)
