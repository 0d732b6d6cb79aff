"""usage.get against the real daemon: pages of runs, `since`, strict params, the totals in session.get
condensed, bridge.isolate and bridge.handoff, the MCP tool, the client method and `memento-sessions usage`."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from memento_sessions import keys
from memento_sessions.backends import Backends
from memento_sessions.cli import main
from memento_sessions.client import Client
from memento_sessions.errors import InvalidParams
from memento_sessions.server.daemon import Daemon
from tests.helpers import SECRET, token
from tests.rpcsocket import rpc
from tests.test_ingest_daemon import url
from tests.test_mcp import over_http

pytestmark = pytest.mark.anyio


def run_events(n: int, output: int, cost: float | None = None) -> list[dict[str, Any]]:
    """One run emitted as a client would: a prompt, one model call's usage, a finished tool, the end."""
    stamp = f"2026-03-01T10:{n:02d}:00Z"
    end: dict[str, Any] = {"id": f"e{n}", "type": "query:completed", "timestamp": f"2026-03-01T10:{n:02d}:30Z",
                           "data": {} if cost is None else {"totalCostUsd": cost}}
    return [{"id": f"p{n}", "type": "query:started", "timestamp": stamp, "data": {"prompt": f"task {n}"}},
            {"id": f"u{n}", "type": "usage", "timestamp": f"2026-03-01T10:{n:02d}:10Z",
             "data": {"messageId": f"m{n}", "model": "claude-y", "apiCalls": 1, "inputTokens": 100,
                      "outputTokens": output, "cacheReadTokens": 5, "cacheCreationTokens": 7}},
            {"id": f"t{n}", "type": "block:upsert", "timestamp": f"2026-03-01T10:{n:02d}:20Z",
             "data": {"block": {"id": f"tool{n}", "kind": "tool_use", "status": "complete"}}},
            end]


async def seeded(daemon: Daemon, namespace: str, runs: int = 5) -> None:
    """A session `s` with `runs` runs by agent `alice`: run n outputs n tokens, odd runs cost n cents."""
    async with rpc(daemon.port, token("alice", namespace)) as peer:
        await peer.call("session.create", {"sessionId": "s"})
        events = [event for n in range(1, runs + 1) for event in run_events(n, n, n / 100 if n % 2 else None)]
        await peer.call("event.emitBatch", {"sessionId": "s", "events": events})


async def test_runs_page_by_cursor_and_since_with_totals_of_all(daemon: Daemon, namespace: str) -> None:
    await seeded(daemon, namespace)
    async with Client(url(daemon), token("reader", namespace), reconnect=False) as client:
        first = await client.usage(session_id="s", limit=2)
        second = await client.usage(session_id="s", limit=2, cursor=first["nextCursor"])
        third = await client.usage(session_id="s", limit=2, cursor=second["nextCursor"])
        late = await client.usage(session_id="s", since="2026-03-01T10:04:00Z")
    pages = [first, second, third]
    assert [[run["outputTokens"] for run in page["runs"]] for page in pages] == [[1, 2], [3, 4], [5]]
    assert "nextCursor" not in third
    assert [run["outputTokens"] for run in late["runs"]] == [4, 5] and "nextCursor" not in late
    run = first["runs"][0]
    assert run == {"runId": "p1", "sessionId": "s", "source": "events", "model": "claude-y", "durationMs": 30_000,
                   "inputTokens": 100, "outputTokens": 1, "cacheReadTokens": 5, "cacheCreationTokens": 7,
                   "toolCalls": 1, "apiCalls": 1, "startedAt": "2026-03-01T10:01:00.000Z", "costUsd": 0.01,
                   "ended": True}
    assert first["runs"][1]["costUsd"] is None  # run 2's source gave no cost: unknown, not 0
    totals = first["totals"]
    assert (totals["runs"], totals["outputTokens"], totals["inputTokens"], totals["toolCalls"]) == (5, 15, 500, 5)
    assert totals["costUsd"] == pytest.approx(0.09) and totals["costUnknownRuns"] == 2
    assert totals["durationMs"] == 5 * 30_000 and totals["source"] == "events"


async def test_bad_params_are_refused_naming_the_field(daemon: Daemon, namespace: str) -> None:
    await seeded(daemon, namespace, runs=1)
    bad: list[tuple[dict[str, Any], str]] = [
        ({"sessionId": "s", "agentId": "alice"}, "agentId"), ({"sessionId": "no spaces"}, "sessionId"),
        ({"limit": 0}, "limit"), ({"limit": 501}, "limit"), ({"since": "yesterday"}, "since"),
        ({"since": "2026-03-01T10:00:00"}, "since"), ({"cursor": "x"}, "cursor"), ({"extra": 1}, "extra"),
        ({"sessionId": 5}, "sessionId")]
    async with Client(url(daemon), token("reader", namespace), reconnect=False) as client:
        for params, field in bad:
            with pytest.raises(InvalidParams) as caught:
                await client.call("usage.get", params)
            assert field in json.dumps(caught.value.data), params
        assert (await client.usage(session_id="s"))["totals"]["runs"] == 1


async def test_condensed_isolate_and_handoff_carry_the_session_totals(daemon: Daemon, namespace: str) -> None:
    await seeded(daemon, namespace, runs=3)
    async with Client(url(daemon), token("reader", namespace), reconnect=False) as client:
        totals = (await client.usage(session_id="s"))["totals"]
        condensed = await client.get("s", condensed=True)
        isolated = await client.call("bridge.isolate", {"sessionId": "s", "agentId": "alice"})
        handoff = await client.call("bridge.handoff", {"sessionId": "s"})
    assert totals["outputTokens"] == 6 and totals["runs"] == 3
    assert condensed["usage"] == totals and isolated["usage"] == totals and handoff["usage"] == totals


async def test_the_mcp_tool_answers_what_the_method_does(daemon: Daemon, namespace: str) -> None:
    await seeded(daemon, namespace, runs=2)
    async with over_http(daemon.port, token("reader", namespace)) as mcp:
        reply = await mcp.call_tool("usage", {"sessionId": "s", "limit": 1})
        agent = await mcp.call_tool("usage", {"agentId": "alice"})
    async with Client(url(daemon), token("reader", namespace), reconnect=False) as client:
        expected = await client.usage(session_id="s", limit=1)
    assert not reply.is_error and reply.structured_content == expected
    assert [run["outputTokens"] for run in agent.structured_content["runs"]] == [1, 2]


async def test_cli_prints_a_table_and_json(daemon: Daemon, namespace: str, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    await seeded(daemon, namespace, runs=2)
    monkeypatch.setenv("MEMENTO_PORT", str(daemon.port))
    monkeypatch.setenv("MEMENTO_AUTH_SECRET", SECRET)
    monkeypatch.setenv("MEMENTO_DATA_DIR", str(daemon.settings.data_dir))
    monkeypatch.delenv("MEMENTO_TOKEN", raising=False)
    capsys.readouterr()
    code = await anyio.to_thread.run_sync(main, ["usage", "--namespace", namespace, "--session", "s", "--json"])
    printed = json.loads(capsys.readouterr().out)
    assert code == 0 and printed["totals"]["outputTokens"] == 3 and len(printed["runs"]) == 2
    code = await anyio.to_thread.run_sync(main, ["usage", "--namespace", namespace, "--agent", "alice"])
    lines = capsys.readouterr().out.splitlines()
    assert code == 0 and lines[0] == "source: events; cost: $0.0100 (1 runs without a cost)"
    assert "outputTokens: 3" in lines[1] and "runs: 2" in lines[1]
    assert lines[3].split()[:3] == ["STARTEDAT", "SESSIONID", "MODEL"]
    assert lines[4].split()[-1] == "$0.0100" and lines[5].split()[-1] == "unknown"
    with pytest.raises(SystemExit) as refused:
        main(["usage", "--namespace", namespace, "--session", "s", "--agent", "a"])
    assert refused.value.code == 2 and "not allowed with argument --session" in capsys.readouterr().err


async def test_a_fold_that_fails_leaves_the_stored_emit_standing(daemon: Daemon, namespace: str,
                                                                  backends: Backends) -> None:
    await seeded(daemon, namespace, runs=1)
    totals = keys.usage_keys(namespace, "s").totals
    await backends.redis.hset(totals, "events:inputTokens", str(2**63 - 10))  # the next add overflows in Redis
    async with rpc(daemon.port, token("alice", namespace)) as peer:
        done = await peer.call("event.emitBatch", {"sessionId": "s", "events": run_events(2, 2)})
        again = await peer.call("event.emitBatch", {"sessionId": "s", "events": run_events(2, 2)})
    assert done["seqs"] == [5, 6, 7, 8] and again == {"seqs": [5, 6, 7, 8], "duplicates": [5, 6, 7, 8]}


async def test_a_cost_of_zero_is_known_not_unknown(daemon: Daemon, namespace: str) -> None:
    async with rpc(daemon.port, token("alice", namespace)) as peer:
        await peer.call("session.create", {"sessionId": "free"})
        await peer.call("event.emitBatch", {"sessionId": "free", "events": run_events(1, 3, cost=0.0)})
    async with Client(url(daemon), token("reader", namespace), reconnect=False) as client:
        got = await client.usage(session_id="free")
        agent = await client.usage(agent_id="alice")
    assert got["runs"][0]["costUsd"] == 0.0 and got["totals"]["costUsd"] == 0.0
    assert got["totals"]["costUnknownRuns"] == 0 and agent["totals"]["costUsd"] == 0.0


STALE = """#!lua name=memento_usage
redis.register_function('mu_fold', function(keys, args) return false end)
"""


async def test_a_daemon_replaces_an_older_usage_library_on_first_use(daemon: Daemon, namespace: str,
                                                                     backends: Backends) -> None:
    await backends.redis.function_load(STALE, replace=True)  # what an older daemon left in Redis
    await seeded(daemon, namespace, runs=1)
    async with Client(url(daemon), token("reader", namespace), reconnect=False) as client:
        got = await client.usage(session_id="s")
    assert got["totals"]["runs"] == 1 and got["runs"][0]["outputTokens"] == 1
