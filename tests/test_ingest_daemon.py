"""Ingest against the real daemon: `memento-sessions ingest` as a process, session.conversation, the condensed
view, bridge.transitions on real activity, and the client's live reducer against the daemon's."""

from __future__ import annotations

import _socket
import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from memento_sessions.cli.pipeline import Pipeline
from memento_sessions.client import Client
from memento_sessions.client.conversation import LiveConversation, load_conversation
from memento_sessions.endpoints import Endpoints
from memento_sessions.errors import NotFound
from memento_sessions.server.daemon import Daemon, running
from tests.helpers import make_settings, token
from tests.rpcsocket import rpc
from tests.test_ingest_convert import FIXTURES, record, result, use
from tests.test_mcp import failed, ok, over_http

pytestmark = pytest.mark.anyio
ROOT = "/repo"
CLI = [sys.executable, "-m", "memento_sessions.cli"]


def url(daemon: Daemon) -> str:
    return f"ws://127.0.0.1:{daemon.port}/ws"


async def ingest(daemon: Daemon, namespace: str, *args: str, stdin: bytes | None = None) -> tuple[int, str, str]:
    """Run `memento-sessions ingest ARGS` as a process; (exit code, stdout, stderr)."""
    env = {**os.environ, "MEMENTO_TOKEN": token("ingester", namespace), "MEMENTO_URL": url(daemon)}
    done = await anyio.run_process([*CLI, "ingest", *args], input=stdin, env=env, check=False)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


def pytest_transcript() -> list[dict[str, Any]]:
    """Edits, a failing pytest, a fix, a passing pytest: one working-to-broken transition."""
    return [
        record("user", "u1", "make the tests pass"),
        use("a1", "t1", "Edit", {"file_path": f"{ROOT}/src/app.py", "old_string": "a", "new_string": "b"}),
        result("r1", "t1", "The file has been updated.", extra={"filePath": f"{ROOT}/src/app.py"}),
        use("a2", "t2", "Write", {"file_path": f"{ROOT}/tests/test_new.py", "content": "def test(): pass\n"}),
        result("r2", "t2", "File created.", extra={"type": "create", "filePath": f"{ROOT}/tests/test_new.py"}),
        use("a3", "t3", "Bash", {"command": "pytest -q tests/"}),
        result("r3", "t3", "Exit code 1\nF\n1 failed in 0.10s", error=True),
        use("a4", "t4", "Edit", {"file_path": f"{ROOT}/src/app.py", "old_string": "b", "new_string": "c"}),
        result("r4", "t4", "The file has been updated.", extra={"filePath": f"{ROOT}/src/app.py"}),
        use("a5", "t5", "Bash", {"command": ".venv/bin/pytest -q"}),
        result("r5", "t5", "....\n4 passed in 0.20s"),
    ]


async def test_ingest_the_transcript_sample_then_again_writes_nothing(daemon: Daemon, namespace: str) -> None:
    sample = str(FIXTURES / "spotter_tool_heavy.jsonl")
    code, out, _ = await ingest(daemon, namespace, sample, "--session", "spotter")
    assert code == 0
    # The converter's hand-counted figures (test_ingest_convert): 39 records, 33 events, 15 skipped.
    assert out.strip() == ("ingested 1 input(s): 39 records read, 33 events written, 0 already there, 0 capped; "
                           "skipped 15 (progress:hook_progress 10, type:file-history-snapshot 3, "
                           "type:queue-operation 2)")
    code, out, _ = await ingest(daemon, namespace, sample, "--session", "spotter")
    assert code == 0 and "33 events written" not in out and "0 events written, 33 already there" in out
    async with Client(url(daemon), token("reader", namespace), reconnect=False) as client:
        assert (await client.get("spotter"))["session"]["seq"] == 33
        page = await client.call("session.conversation", {"sessionId": "spotter"})
        condensed: dict[str, Any] = dict(await client.get("spotter", condensed=True))  # the ingest keys are extra
    kinds: dict[str, int] = {}
    for block in page["blocks"]:
        kinds[block["kind"]] = kinds.get(block["kind"], 0) + 1
    assert kinds == {"user_message": 2, "tool_use": 6, "assistant_text": 2, "thinking": 1, "system": 7}
    assert page["blockCount"] == 18 and "nextCursor" not in page and page["subagents"] == []
    assert [(tool["name"], tool["count"]) for tool in condensed["tools"]] == [
        ("Bash", 2), ("Glob", 1), ("Read", 1), ("WebFetch", 1), ("WebSearch", 1)]
    assert [prompt["prompt"][:28] for prompt in condensed["prompts"]] == [
        "start phoenix in background", "scrolling back in xterm.js s"]
    assert condensed["todos"] == [] and condensed["tasks"] == []
    assert condensed["counts"] == {"block:upsert": 24, "query:started": 2, "query:failed": 2, "usage": 5}


async def test_failing_then_passing_pytest_gives_one_transition_whose_window_holds_the_edits(
        daemon: Daemon, namespace: str, tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    path.write_text("\n".join(json.dumps(rec) for rec in pytest_transcript()) + "\n")
    code, out, _ = await ingest(daemon, namespace, str(path))
    # The prompt: its block and query:started; 5 tool uses and their 5 results (merged into the blocks, one
    # upsert each); 3 edits (modified), the failing pytest (broke) and the passing one (test_pass): 17.
    assert code == 0 and "11 records read, 17 events written" in out
    async with Client(url(daemon), token("reader", namespace), reconnect=False) as client:
        found = await client.call("bridge.transitions", {"sessionId": "s1"})
        app = await client.call("bridge.transitions", {"sessionId": "s1", "entityId": "file:src/app.py"})
        new = await client.call("bridge.transitions", {"sessionId": "s1", "entityId": "file:tests/test_new.py"})
        other = await client.call("bridge.transitions", {"sessionId": "s1", "entityId": "file:README.md"})
        events = [event async for event in client.iter_events("s1")]
    [item] = found["transitions"]
    broke = next(event for event in events if event["type"] == "broke")
    assert (item["fromSeq"], item["toSeq"]) == (0, broke["seq"])
    assert app["transitions"] == [item] and new["transitions"] == [item] and other["transitions"] == []
    assert [event["type"] for event in events].count("test_pass") == 1


async def test_malformed_lines_are_counted_and_skipped_and_stdin_works(daemon: Daemon, namespace: str) -> None:
    good = [json.dumps(rec) for rec in pytest_transcript()[:3]]
    lines = [good[0], '{"type": "user", "uuid": "x1", "sess', "not json at all", '{"type": 12, "sessionId": "s1"}',
             '{"type": "mystery", "sessionId": "s1", "uuid": "m1"}', "[1, 2]", *good[1:]]
    code, out, _ = await ingest(daemon, namespace, "-", "--session", "bad-lines",
                                stdin=("\n".join(lines) + "\n").encode())
    assert code == 0
    # 8 lines, 3 good: the prompt (its block and query:started), an Edit and its result (one block) with its
    # `modified`; the truncated line and the garbage are bad JSON, the rest skipped by what is wrong with them.
    assert out.strip() == ("ingested 1 input(s): 8 records read, 5 events written, 0 already there, 0 capped; "
                           "skipped 5 (bad_json 2, unknown_type:12 1, unknown_type:mystery 1, not_an_object 1)")


async def test_conversation_pages_and_refuses_bad_params(daemon: Daemon, namespace: str, tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    path.write_text("\n".join(json.dumps(rec) for rec in pytest_transcript()) + "\n")
    assert (await ingest(daemon, namespace, str(path), "--session", "paged"))[0] == 0
    async with rpc(daemon.port, token("reader", namespace)) as ws:
        first = await ws.call("session.conversation", {"sessionId": "paged", "limit": 4})
        second = await ws.call("session.conversation", {"sessionId": "paged", "limit": 4, "cursor": 4})
        past = await ws.call("session.conversation", {"sessionId": "paged", "cursor": 6})
        # 6 blocks: the prompt and 5 tool uses (each result merged into its use).
        assert [len(first["blocks"]), len(second["blocks"]), len(past["blocks"])] == [4, 2, 0]
        assert (first["nextCursor"], "nextCursor" in second, "nextCursor" in past) == (4, False, False)
        assert [block["id"] for block in first["blocks"] + second["blocks"]] == ["u1", "t1", "t2", "t3", "t4", "t5"]
        assert first["blockCount"] == 6 and first["subagents"] == [] and first["idle"] is False
        for params, field in (({"sessionId": "paged", "limit": 0}, "limit"),
                              ({"sessionId": "paged", "cursor": -1}, "cursor"),
                              ({"sessionId": "pa ged"}, "sessionId"),
                              ({"sessionId": "paged", "subagentId": "a\x00b"}, "subagentId"),
                              ({"sessionId": "paged", "extra": 1}, "extra")):
            error = await ws.error("session.conversation", params)
            assert error["code"] == -32602 and [item["field"] for item in error["data"]] == [field]
        missing = await ws.error("session.conversation", {"sessionId": "paged", "subagentId": "nobody"})
        assert missing["code"] == -32004
        assert (await ws.call("session.get", {"sessionId": "paged"}))["session"]["seq"] == 17  # nothing written
    async with rpc(daemon.port, token("stranger", "other" + namespace)) as ws:
        assert (await ws.error("session.conversation", {"sessionId": "paged"}))["code"] == -32004


async def test_the_clients_live_reducer_equals_the_daemons_for_a_stream_with_deltas(
        daemon: Daemon, namespace: str) -> None:
    lines = (FIXTURES / "opencode_events.jsonl").read_text().splitlines()
    from memento_sessions.ingest import convert_lines

    events = convert_lines(lines).events
    async with Client(url(daemon), token("streamer", namespace), reconnect=False) as client:
        await client.create_session(session_id="live")
        live = LiveConversation()
        async with client.subscribe("live") as sub:
            for event in events:  # one emit per event, as an agent streams
                await client.call("event.emit", {"sessionId": "live", "event": event})
            with anyio.fail_after(10):
                async for item in live.follow(sub):
                    if item["seq"] == len(events):
                        break
        served = await client.call("session.conversation", {"sessionId": "live", "limit": 1000})
        loaded = await load_conversation(client, "live")
    view = live.view()
    assert view == loaded.view()
    assert [block["id"] for block in view["blocks"]] == [block["id"] for block in served["blocks"]]
    assert view["blocks"] == served["blocks"] and view["idle"] is served["idle"] is True
    assert [(agent["id"], agent["status"]) for agent in served["subagents"]] == [("prt_t5", "completed")]


async def test_get_conversation_over_mcp_pages_declares_its_keys_and_refuses_bad_arguments(
        daemon: Daemon, namespace: str, tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    path.write_text("\n".join(json.dumps(rec) for rec in pytest_transcript()) + "\n")
    assert (await ingest(daemon, namespace, str(path), "--session", "over-mcp"))[0] == 0
    async with over_http(daemon.port, token("mcp-reader", namespace)) as mcp:
        tools = {tool.name: tool for tool in (await mcp.list_tools()).tools}
        schema = tools["get_conversation"].output_schema
        first = ok(await mcp.call_tool("get_conversation", {"sessionId": "over-mcp", "limit": 5}))
        rest = ok(await mcp.call_tool("get_conversation", {"sessionId": "over-mcp", "cursor": first["nextCursor"]}))
        bad = failed(await mcp.call_tool("get_conversation", {"sessionId": "over-mcp", "limit": 0}))
        gone = failed(await mcp.call_tool("get_conversation", {"sessionId": "nope"}))
        condensed = ok(await mcp.call_tool("get_session", {"sessionId": "over-mcp", "condensed": True}))
    assert tools["get_conversation"].annotations is not None and tools["get_conversation"].annotations.read_only_hint
    assert schema is not None and set(schema["properties"]) - {"notices"} == set(first) | {"nextCursor"} == set(first)
    assert [len(first["blocks"]), first["nextCursor"], len(rest["blocks"]), "nextCursor" in rest] == [5, 5, 1, False]
    assert bad == ("Error executing tool get_conversation: invalid params (-32602); limit: Input should be greater "
                   "than or equal to 1")
    assert gone.startswith("Error executing tool get_conversation: session 'nope' not found (-32004)")
    assert [(tool["name"], tool["count"]) for tool in condensed["tools"]] == [("Bash", 2), ("Edit", 2), ("Write", 1)]
    assert [prompt["prompt"] for prompt in condensed["prompts"]] == ["make the tests pass"]


async def test_conversation_reply_stays_under_a_quarter_of_the_send_buffer(
        backend_urls: Endpoints, tmp_path: Path, namespace: str) -> None:
    settings = make_settings(backend_urls, tmp_path, ws_send_buffer=64 * 1024)  # the smallest: 16 KiB per reply
    big = "x" * 3000
    events = [{"id": f"b{n}", "type": "block:upsert", "data": {"block": {"id": f"b{n}", "kind": "assistant_text",
                                                                      "status": "complete", "content": big}}}
              for n in range(40)]
    async with running(settings) as daemon, rpc(daemon.port, token("writer", namespace)) as ws:
        await ws.call("session.create", {"sessionId": "wordy"})
        await ws.call("event.emitBatch", {"sessionId": "wordy", "events": events})
        seen, cursor, pages = [], 0, 0
        while cursor is not None:
            reply = await ws.call("session.conversation", {"sessionId": "wordy", "cursor": cursor})
            assert len(json.dumps(reply, separators=(",", ":"))) <= 16 * 1024
            seen += [block["id"] for block in reply["blocks"]]
            cursor, pages = reply.get("nextCursor"), pages + 1
    # ~3.1 KB a block (3,000 characters and its keys): 5 fit in the 16 KiB budget beside the rest of the
    # reply, 6 do not, so 40 blocks take 8 pages.
    assert seen == [f"b{n}" for n in range(40)] and pages == 8


async def test_directories_and_globs_each_file_into_its_own_session(daemon: Daemon, namespace: str,
                                                                   tmp_path: Path) -> None:
    folder = tmp_path / "runs"
    (folder / "deep").mkdir(parents=True)
    for name, sid in (("a.jsonl", "run-a"), ("deep/b.jsonl", "run-b")):
        recs = [{**rec, "sessionId": sid} for rec in pytest_transcript()[:3]]
        (folder / name).write_text("\n".join(json.dumps(rec) for rec in recs) + "\n")
    (folder / "notes.txt").write_text("not an input\n")
    code, out, err = await ingest(daemon, namespace, str(folder))
    assert code == 0 and out.startswith("ingested 2 input(s): 6 records read, 10 events written, 0 already there")
    assert err.splitlines() == [f"{folder}/a.jsonl: 5 events sent (3 records read so far)",
                                f"{folder}/deep/b.jsonl: 5 events sent (6 records read so far)"]
    code, out, _ = await ingest(daemon, namespace, str(folder / "**" / "*.jsonl"))
    assert code == 0 and "6 records read, 0 events written, 10 already there" in out
    code, out, _ = await ingest(daemon, namespace, str(folder / "missing.jsonl"))
    assert code == 1 and "failed: " in out and "missing.jsonl" in out
    async with Client(url(daemon), token("reader", namespace), reconnect=False) as client:
        assert [(await client.get(sid))["session"]["seq"] for sid in ("run-a", "run-b")] == [5, 5]


async def test_an_input_without_events_creates_no_session_and_a_second_input_joins_the_first(
        daemon: Daemon, namespace: str, tmp_path: Path) -> None:
    """The session is created before the first batch (not on its NotFound), only when there is one."""
    quiet = tmp_path / "quiet.jsonl"
    quiet.write_text(json.dumps({"type": "file-history-snapshot", "messageId": "m1", "snapshot": {}}) + "\n")
    work = tmp_path / "work.jsonl"
    work.write_text("\n".join(json.dumps(rec) for rec in pytest_transcript()[:3]) + "\n")
    code, out, _ = await ingest(daemon, namespace, str(quiet), "--session", "nothing-here")
    assert code == 0 and "1 records read, 0 events written" in out
    code, out, _ = await ingest(daemon, namespace, str(work), str(quiet), str(work), "--session", "joined")
    assert code == 0 and "7 records read, 5 events written, 5 already there" in out, out
    async with Client(url(daemon), token("reader", namespace), reconnect=False) as client:
        with pytest.raises(NotFound):
            await client.get("nothing-here")
        assert (await client.get("joined"))["session"]["seq"] == 5


async def test_the_pipeline_sends_what_a_lost_connection_left_unanswered_again_and_it_is_stored_once(
        daemon: Daemon, namespace: str) -> None:
    def batch(*ids: str) -> bytes:
        return json.dumps({"sessionId": "lost", "events": [{"id": eid, "type": "modified"} for eid in ids]}).encode()

    def lose_a_connection() -> list[tuple[int, Any]]:
        pipe = Pipeline(url(daemon), token("ingester", namespace), 10.0)
        try:
            pipe.call("session.create", {"sessionId": "lost"})
            sent = [pipe.send("event.emitBatch", batch("e1", "e2")), pipe.send("event.emitBatch", batch("e3"))]
            lost = pipe.wire
            lost.sock.shutdown(_socket.SHUT_RDWR)  # gone with both requests unanswered here
            replies = [pipe.reply(), pipe.reply()]
            assert pipe.wire is not lost and [request_id for request_id, _ in replies] == sent
            assert pipe.unanswered == {}
            return replies
        finally:
            pipe.close()

    replies = await anyio.to_thread.run_sync(lose_a_connection)
    # Whether the daemon stored the batches before the connection went or only after they were sent again,
    # each event is there once, in order.
    assert [result["seqs"] for _, result in replies] == [[1, 2], [3]]
    async with Client(url(daemon), token("reader", namespace), reconnect=False) as client:
        assert [event["id"] async for event in client.iter_events("lost")] == ["e1", "e2", "e3"]


async def test_batches_pipelined_behind_large_ones_are_answered_in_order_a_bad_one_with_its_error(
        daemon: Daemon, namespace: str) -> None:
    """Behind a frame of 64 KiB or more the daemon prepares the next request while the first one runs; each
    still runs after the one before it: results, errors and the stored order are those of one at a time."""
    def batch(prefix: str, count: int, bad: bool = False) -> bytes:
        events: list[dict[str, Any]] = [{"id": f"{prefix}{i}", "type": "modified", "data": {"pad": "x" * 200}}
                                        for i in range(count)]
        if bad:
            events[-1]["type"] = ""  # one invalid event refuses the whole batch
        return json.dumps({"sessionId": "ahead", "events": events}).encode()

    def pipelined() -> list[Any]:
        pipe = Pipeline(url(daemon), token("ingester", namespace), 10.0)
        try:
            pipe.call("session.create", {"sessionId": "ahead"})
            frames = [batch("a", 400), batch("c", 400, bad=True), batch("b", 400), batch("d", 2)]
            assert [len(frame) >= 64 * 1024 for frame in frames] == [True, True, True, False]
            sent = [pipe.send("event.emitBatch", frame) for frame in frames]
            sent.append(pipe.send("session.get", b'{"sessionId":"ahead"}'))
            replies = [pipe.reply() for _ in sent]
            assert [request_id for request_id, _ in replies] == sent
            return [result for _, result in replies]
        finally:
            pipe.close()

    first, refused, second, third, got = await anyio.to_thread.run_sync(pipelined)
    assert first["seqs"] == list(range(1, 401)) and second["seqs"] == list(range(401, 801))
    assert third["seqs"] == [801, 802] and got["session"]["seq"] == 802
    assert refused.code == -32602 and any("events.399" in error["field"] for error in refused.data)


async def test_a_daemon_that_cannot_be_reached_fails_the_run_in_one_line(namespace: str) -> None:
    env = {**os.environ, "MEMENTO_TOKEN": token("ingester", namespace), "MEMENTO_URL": "ws://127.0.0.1:9/ws"}
    done = await anyio.run_process([*CLI, "ingest", str(FIXTURES / "spotter_tool_heavy.jsonl")], env=env,
                                   check=False)
    assert done.returncode == 1 and done.stdout == b""
    assert done.stderr.decode().startswith("memento-sessions ingest: cannot connect to ws://127.0.0.1:9/ws: ")


def test_the_progress_bar_on_a_terminal_counts_inputs_and_events() -> None:
    from io import StringIO

    from memento_sessions.cli.ingest import Progress, Totals

    class Terminal(StringIO):
        def isatty(self) -> bool:
            return True

    out, totals = Terminal(), Totals(written=700, already=300)
    progress = Progress(out, 2)
    progress.show("a.jsonl", 500, totals=totals)
    progress.done("a.jsonl", 1000, totals)
    assert out.getvalue().split("\r")[1:] == [
        "[....................] 0/2 inputs  a.jsonl: 500 events sent; 700 written, 300 already there ",
        "[##########..........] 1/2 inputs  a.jsonl: 1000 events sent; 700 written, 300 already there "]
