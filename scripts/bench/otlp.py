"""otlp: Claude Code's `claude_code.api_request` log records through the daemon's `POST /v1/logs`.

Protobuf export requests of 512 records each (Claude Code's exporter batches up to 512), over 8 sessions
(one per request) and 4 prompts a session, 4 requests in flight; in records/s, decoding and the
session's Function call included. The floor: bare redis-py FCALL mu_fold of the same ops, one call per
request, the ops built before the clock starts.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import anyio
import httpx2
from google.protobuf import json_format  # type: ignore[import-untyped]
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from bench.harness import Env, Figure, Target, new_session
from memento_sessions import keys
from memento_sessions.usage.otlp import log_batch

SAMPLE = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "claude_code_otlp_logs.json"
RECORDS, SESSIONS, IN_FLIGHT = 512, 8, 4


def export(session_id: str, copy: int = 0) -> bytes:
    """One request: the sample's first api_request record RECORDS times, in `session_id`, over 4 prompts; each
    `copy` a request of its own (its first record a nanosecond later), not a retry the receiver would skip."""
    doc = json.loads(SAMPLE.read_text())
    scope = doc["resourceLogs"][0]["scopeLogs"][0]
    template = next(r for r in scope["logRecords"] if r["body"]["stringValue"] == "claude_code.api_request")
    records = []
    for n in range(RECORDS):
        record = json.loads(json.dumps(template))
        for kv in record["attributes"]:
            if kv["key"] in ("session.id", "prompt.id"):
                kv["value"]["stringValue"] = session_id if kv["key"] == "session.id" else f"{session_id}-p{n % 4}"
        records.append(record)
    records[0]["timeUnixNano"] = str(int(records[0].get("timeUnixNano") or 0) + copy)
    scope["logRecords"] = records
    return bytes(json_format.Parse(json.dumps(doc), ExportLogsServiceRequest()).SerializeToString())


async def otlp_logs(env: Env) -> Figure:
    """Log records per second the receiver takes, beside bare FCALL mu_fold of the same ops."""
    manager = env.manager()
    sids = [await new_session(env, manager) for _ in range(SESSIONS)]
    bodies = [export(sid, copy) for copy in range(2 if env.quick else 8) for sid in sids]
    headers = {"content-type": "application/x-protobuf", "authorization": f"Bearer {env.token('claude')}"}
    url = f"http://127.0.0.1:{env.port}/v1/logs"
    async with httpx2.AsyncClient() as http:
        await post(http, url, export(sids[0], -1), headers)  # the library loads on first use
        sends = anyio.Semaphore(IN_FLIGHT)

        async def send(body: bytes) -> None:
            async with sends:
                await post(http, url, body, headers)

        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for body in bodies:
                tg.start_soon(send, body)
        elapsed = time.perf_counter() - start
    others = {sid: await new_session(env, manager) for sid in sids}  # the floor folds into sessions of its own
    floor = len(bodies) * RECORDS / await bare_folds(env, others, bodies)
    return Figure(f"otlp, {len(bodies) * RECORDS:,} api_request log records ({RECORDS} a request), /v1/logs",
                  "records/s", len(bodies) * RECORDS / elapsed, floor, Target.at_least(5_000, "records/s"))


async def post(http: httpx2.AsyncClient, url: str, body: bytes, headers: dict[str, str]) -> None:
    reply = await http.post(url, content=body, headers=headers)
    if reply.status_code != 200:
        raise RuntimeError(f"/v1/logs answered {reply.status_code}: {reply.text}")


async def bare_folds(env: Env, others: dict[str, str], bodies: list[bytes]) -> float:
    """Seconds of bare FCALL mu_fold, one call per request of the same ops, into the `others` sessions."""
    calls = []
    for body in bodies:
        [(sid, ops)] = log_batch(body, False, RECORDS).ops.items()
        assert sid is not None
        other = others[sid]
        fkeys = [keys.session_keys(env.namespace, other).session, *keys.usage_keys(env.namespace, other).all()]
        calls.append((fkeys, ["otel", 500, 3_600_000, 64, json.dumps(ops, separators=(",", ":"))]))
    start = time.perf_counter()
    for fkeys, args in calls:
        await env.redis.fcall("mu_fold", len(fkeys), *fkeys, *args)
    return time.perf_counter() - start
