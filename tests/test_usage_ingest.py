"""Usage from ingested agents, against the real daemon: the real transcripts of tests/fixtures (copied from
public repositories, see tests/fixtures/SOURCES.md) ingested by `memento-sessions ingest`, each run's totals
checked against a count this test makes from the file itself; re-ingesting counts nothing twice; runs kept
per session are bounded; another namespace sees nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from memento_sessions.client import Client
from memento_sessions.endpoints import Endpoints
from memento_sessions.server.daemon import Daemon, running
from tests.helpers import make_settings, token
from tests.test_ingest_convert import FIXTURES
from tests.test_ingest_daemon import ingest, url

pytestmark = pytest.mark.anyio
TRANSCRIPT = FIXTURES / "spotter_tool_heavy.jsonl"
STREAM = FIXTURES / "gleam_basic_query.ndjson"
INTERRUPTED = "[Request interrupted by user"
USAGE = {"inputTokens": "input_tokens", "outputTokens": "output_tokens", "cacheReadTokens": "cache_read_input_tokens",
         "cacheCreationTokens": "cache_creation_input_tokens"}


def millis(stamp: str) -> int:
    from datetime import datetime
    return int(datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() * 1000)


def is_prompt(record: dict[str, Any]) -> bool:
    """A prompt the user typed: a plain string, not a slash command's or Claude Code's own lines."""
    content = record["message"]["content"]
    return (record["type"] == "user" and isinstance(content, str) and not record.get("isMeta")
            and not content.startswith("<"))


def transcript_runs(path: Path) -> list[dict[str, Any]]:
    """Each prompt's turn counted from the transcript: the last usage each message reports (Claude Code
    repeats it on every line of the message), tool results, and the time to the interrupt or last record."""
    runs: list[dict[str, Any]] = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if record.get("type") not in ("user", "assistant"):
            continue
        if is_prompt(record):
            runs.append({"start": millis(record["timestamp"]), "end": None, "messages": {}, "tools": 0})
            continue
        run, content = runs[-1], record["message"]["content"]
        if isinstance(content, str):  # a slash command's lines: no model call
            continue
        if record["type"] == "assistant":
            run["messages"][record["message"]["id"]] = (record["message"]["model"], record["message"]["usage"])
            run["last"] = millis(record["timestamp"])
        elif any(item.get("type") == "tool_result" for item in content):
            run["tools"] += sum(item.get("type") == "tool_result" for item in content)
            run["last"] = millis(record["timestamp"])
        elif any(str(item.get("text", "")).startswith(INTERRUPTED) for item in content):
            run["end"] = millis(record["timestamp"])
    return [{**{field: sum(usage[name] for _, usage in run["messages"].values()) for field, name in USAGE.items()},
             "model": list(run["messages"].values())[-1][0], "toolCalls": run["tools"],
             "apiCalls": len(run["messages"]), "costUsd": None,
             "durationMs": (run["end"] or run["last"]) - run["start"]} for run in runs]


def picked(row: dict[str, Any]) -> dict[str, Any]:
    return {key: row[key] for key in ("inputTokens", "outputTokens", "cacheReadTokens", "cacheCreationTokens",
                                      "model", "toolCalls", "apiCalls", "costUsd", "durationMs")}


async def test_transcript_runs_match_the_count_made_from_the_file(daemon: Daemon, namespace: str) -> None:
    expected = transcript_runs(TRANSCRIPT)
    assert len(expected) == 2 and expected[1]["outputTokens"] == 11 + 173  # the last line of a message counts
    code, _, _ = await ingest(daemon, namespace, str(TRANSCRIPT), "--session", "spotter")
    assert code == 0
    async with Client(url(daemon), token("reader", namespace), reconnect=False) as client:
        usage = await client.call("usage.get", {"sessionId": "spotter"})
        assert [picked(row) for row in usage["runs"]] == expected
        assert all(row["ended"] and row["source"] == "events" for row in usage["runs"])
        totals = usage["totals"]
        for field in USAGE:
            assert totals[field] == sum(run[field] for run in expected)
        assert totals["runs"] == 2 and totals["costUsd"] is None and totals["costUnknownRuns"] == 2
        assert totals["durationMs"] == sum(run["durationMs"] for run in expected)
        assert (await client.get("spotter", condensed=True))["usage"] == totals

        code, _, _ = await ingest(daemon, namespace, str(TRANSCRIPT), "--session", "spotter")
        assert code == 0
        again = await client.call("usage.get", {"sessionId": "spotter"})
        assert again["totals"] == totals and again["runs"] == usage["runs"]  # nothing counted twice

        mine = await client.call("usage.get", {"agentId": "ingester"})
        assert mine["totals"] == totals and [row["sessionId"] for row in mine["runs"]] == ["spotter", "spotter"]
        spend = await client.call("usage.get", {})
        assert spend["namespace"] == namespace and spend["totals"] == totals


async def test_stream_json_run_takes_the_result_cost_duration_and_usage(daemon: Daemon, namespace: str) -> None:
    lines = [json.loads(line) for line in STREAM.read_text().splitlines()]
    result = next(line for line in lines if line["type"] == "result")
    init = next(line for line in lines if line["type"] == "system")
    code, _, _ = await ingest(daemon, namespace, str(STREAM), "--session", "gleam")
    assert code == 0
    async with Client(url(daemon), token("reader", namespace), reconnect=False) as client:
        usage = await client.call("usage.get", {"sessionId": "gleam"})
    [run] = usage["runs"]
    assert {field: run[field] for field in USAGE} == {field: result["usage"][name] for field, name in USAGE.items()}
    assert run["costUsd"] == result["total_cost_usd"] and run["durationMs"] == result["duration_ms"]
    assert run["model"] == init["model"] and run["toolCalls"] == 0 and run["apiCalls"] == 1
    assert usage["totals"]["costUsd"] == result["total_cost_usd"] and usage["totals"]["costUnknownRuns"] == 0
    assert usage["totals"]["outputTokens"] == result["usage"]["output_tokens"]


def prompt_and_answer(n: int, output: int) -> list[dict[str, Any]]:
    """One run of a made-up transcript: a prompt and an answer using `output` tokens."""
    stamp = f"2026-01-01T00:0{n}:00.000Z"
    head = {"sessionId": "three", "parentUuid": None}
    return [{**head, "type": "user", "uuid": f"u{n}", "timestamp": stamp,
             "message": {"role": "user", "content": f"task {n}"}},
            {**head, "type": "assistant", "uuid": f"a{n}", "timestamp": stamp.replace(":00.000", ":05.000"),
             "message": {"id": f"m{n}", "model": "claude-x", "role": "assistant",
                         "content": [{"type": "text", "text": "done"}], "usage": {"input_tokens": 1,
                                                                                   "output_tokens": output}}}]


async def test_runs_kept_per_session_are_bounded_and_totals_keep_all(backend_urls: Endpoints, tmp_path: Path,
                                                                       namespace: str) -> None:
    path = tmp_path / "three.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for n in (1, 2, 3) for record in prompt_and_answer(n, n * 10)))
    settings = make_settings(backend_urls, tmp_path, usage_runs_per_session=2, usage_runs_per_agent=2)
    async with running(settings) as daemon:
        code, _, _ = await ingest(daemon, namespace, str(path), "--session", "three")
        assert code == 0
        async with Client(url(daemon), token("reader", namespace), reconnect=False) as client:
            usage = await client.call("usage.get", {"sessionId": "three"})
            agent = await client.call("usage.get", {"agentId": "ingester"})
    assert [row["outputTokens"] for row in usage["runs"]] == [20, 30]  # the oldest run dropped
    assert usage["totals"]["outputTokens"] == 60 and usage["totals"]["runs"] == 3
    assert [row["outputTokens"] for row in agent["runs"]] == [20, 30] and agent["totals"]["outputTokens"] == 60


async def test_another_namespace_sees_nothing(daemon: Daemon, namespace: str) -> None:
    code, _, _ = await ingest(daemon, namespace, str(TRANSCRIPT), "--session", "spotter")
    assert code == 0
    async with Client(url(daemon), token("ingester", namespace + "x"), reconnect=False) as client:
        usage = await client.call("usage.get", {"sessionId": "spotter"})
        agent = await client.call("usage.get", {"agentId": "ingester"})
        spend = await client.call("usage.get", {})
    for seen in (usage, agent, spend):
        assert seen["runs"] == [] and seen["bySource"] == {} and seen["totals"]["inputTokens"] == 0


def opencode_assistant(tokens: dict[str, Any], cost: float, created: int) -> dict[str, Any]:
    """OpenCode's message.updated of one assistant message, as it streams (tokens and cost so far)."""
    info = {"id": "msg_a1", "sessionID": "ses_main", "role": "assistant", "time": {"created": created},
            "modelID": "claude-sonnet-4-5", "providerID": "anthropic", "cost": cost, "tokens": tokens}
    return {"type": "message.updated", "properties": {"info": info}}


async def test_opencode_message_tokens_and_cost_as_they_grow(daemon: Daemon, namespace: str, tmp_path: Path) -> None:
    user = {"type": "message.updated", "properties": {"info": {
        "id": "msg_u1", "sessionID": "ses_main", "role": "user", "time": {"created": 1760000000000}}}}
    zero = {"input": 0, "output": 0, "reasoning": 0, "cache": {"read": 0, "write": 0}}
    half = {"input": 1200, "output": 40, "reasoning": 0, "cache": {"read": 0, "write": 300}}
    full = {"input": 1200, "output": 90, "reasoning": 25, "cache": {"read": 800, "write": 300}}
    lines = [user, opencode_assistant(zero, 0, 1760000000100), opencode_assistant(half, 0.004, 1760000001000),
             opencode_assistant(half, 0.004, 1760000001000), opencode_assistant(full, 0.0095, 1760000002000),
             {"type": "session.idle", "properties": {"sessionID": "ses_main"}}]
    path = tmp_path / "opencode.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    for _ in range(2):  # the second ingest writes nothing, and counts nothing twice
        code, _, _ = await ingest(daemon, namespace, str(path), "--session", "oc")
        assert code == 0
    async with Client(url(daemon), token("reader", namespace), reconnect=False) as client:
        usage = await client.call("usage.get", {"sessionId": "oc"})
    [run] = usage["runs"]
    assert picked(run) == {"inputTokens": 1200, "outputTokens": 90 + 25, "cacheReadTokens": 800,
                           "cacheCreationTokens": 300, "model": "claude-sonnet-4-5", "toolCalls": 0, "apiCalls": 1,
                           "costUsd": 0.0095, "durationMs": 2000}
    assert usage["totals"]["costUsd"] == 0.0095 and usage["totals"]["costUnknownRuns"] == 0
