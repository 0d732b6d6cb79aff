"""The converters of real agents' activity and the conversation reducer: pure code, no servers.

Counts on the shipped samples were taken by reading the files line by line (see each test's comments).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from memento_sessions.ingest import convert_hook, convert_lines, converter, reduce
from memento_sessions.ingest.events import Stats, clean, encoded_size
from memento_sessions.ingest.signals import check_kind

FIXTURES = Path(__file__).parent / "fixtures"
ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}\Z")
TYPE = re.compile(r"^[a-z][a-z0-9_.:-]{0,63}$")
ROOT = "/repo"


def lines(name: str) -> list[str]:
    return (FIXTURES / name).read_text().splitlines()


def by_type(events: list[dict[str, Any]]) -> Counter[str]:
    return Counter(event["type"] for event in events)


def blocks_of(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = reduce(events).view()["blocks"]
    return blocks


# --- the shipped samples ------------------------------------------------------------------------------------------


def test_claude_code_transcript_sample_counts() -> None:
    result = convert_lines(lines("spotter_tool_heavy.jsonl"))
    # Lines 1, 19, 25 are file-history-snapshots; 2, 3, 6-8, 14-16, 31, 35 hook_progress; 9, 10 queue-operations.
    assert result.stats.as_dict() == {
        "records": 39, "events": 33, "capped": 0,  # the longest tool result (line 33) has 3,061 characters
        "skipped": {"type:file-history-snapshot": 3, "progress:hook_progress": 10, "type:queue-operation": 2}}
    # Prompts on lines 4 and 26 start queries; the interrupts on lines 18 and 39 fail them.
    # Usage on lines 5, 12 (13 repeats it), 27 (28-30 repeat it), 33 and 37 (the same message, grown to 173 out).
    assert by_type(result.events) == {"block:upsert": 24, "query:started": 2, "query:failed": 2, "usage": 5}
    view = reduce(result.events).view()
    # 2 prompts, 6 tool uses (their results merge into them), text on 12 and 27, thinking on 28, and 7 system
    # lines: interrupts 18 and 39, meta/command lines 20-22, local_command records 23-24.
    assert Counter(block["kind"] for block in view["blocks"]) == {
        "user_message": 2, "tool_use": 6, "assistant_text": 2, "thinking": 1, "system": 7}
    assert all(block["status"] == "complete" for block in view["blocks"])
    condensed = view["condensed"]
    assert [(tool["name"], tool["count"]) for tool in condensed["tools"]] == [
        ("Bash", 2), ("Glob", 1), ("Read", 1), ("WebFetch", 1), ("WebSearch", 1)]
    assert condensed["tools"][0]["lastUsed"] == "2026-02-10T22:58:02.888Z"
    assert [prompt["prompt"] for prompt in condensed["prompts"]] == [
        "start phoenix in background",
        "scrolling back in xterm.js still does not work (maybe because outer web catches it)? websearch xterm.js "
        "tmux interactions"]
    assert view["subagents"] == [] and condensed["todos"] == [] and condensed["tasks"] == []
    assert not [event for event in result.events if event["type"] in ("modified", "broke", "test_pass")]


def test_stream_json_sample() -> None:
    result = convert_lines(lines("gleam_basic_query.ndjson"))
    assert result.stats.as_dict() == {"records": 3, "events": 6, "capped": 0, "skipped": {}}
    assert [event["type"] for event in result.events] == [
        "metadata:update", "query:started", "block:upsert", "usage", "query:completed", "session:idle"]
    assert result.events[0]["data"]["init"]["model"] == "claude-opus-4-5-20251101"
    assert result.events[2]["data"]["block"] == {"id": "msg_01Y1Lo6gYUXN71XaAq7sjUPm:0", "kind": "assistant_text",
                                                 "status": "complete", "content": "4"}
    done = result.events[4]
    assert done["id"] == "894a597c-b4ec-4baf-8a0e-6809b77f00b0"
    assert (done["data"]["result"], done["data"]["numTurns"], done["data"]["totalCostUsd"]) == ("4", 1, 0.1354875)
    assert reduce(result.events).view()["idle"] is True


def test_opencode_sample_counts() -> None:
    result = convert_lines(lines("opencode_events.jsonl"))
    assert result.stats.as_dict() == {"records": 31, "events": 30, "capped": 0, "skipped": {
        "unknown_type:server.connected": 1, "unknown_type:lsp.updated": 1, "message.updated:assistant": 3,
        "session.idle:subagent": 1, "part:step-finish": 1, "session.status:idle": 1}}
    assert by_type(result.events) == {
        "block:upsert": 13, "block:delta": 2, "metadata:update": 4, "query:started": 1, "query:completed": 1,
        "query:failed": 1, "session:idle": 1, "modified": 2, "broke": 1, "test_pass": 1, "subagent:spawned": 1,
        "subagent:completed": 1, "file:modified": 1}
    signals = [(event["type"], event.get("changeInfo", {}).get("entityIds")) for event in result.events
               if event["type"] in ("modified", "broke", "test_pass")]
    assert signals == [("broke", None), ("modified", ["file:src/parser.py"]),
                       ("modified", ["file:tests/test_parser.py"]), ("test_pass", None)]
    view = reduce(result.events).view()
    assert [(block["id"], block["kind"]) for block in view["blocks"]] == [
        ("prt_u1", "user_message"), ("prt_r1", "thinking"), ("prt_t1", "tool_use"), ("prt_t2", "tool_use"),
        ("prt_t3", "tool_use"), ("prt_t4", "tool_use"), ("prt_t5", "tool_use"), ("prt_a2", "assistant_text")]
    assert view["blocks"][1]["content"] == "Let me run the tests."
    [sub] = view["subagents"]
    assert (sub["id"], sub["status"], sub["agentType"], [b["content"] for b in sub["blocks"]]) == (
        "prt_t5", "completed", "general", ["Looks correct."])
    condensed = view["condensed"]
    assert [(tool["name"], tool["count"]) for tool in condensed["tools"]] == [
        ("bash", 2), ("edit", 1), ("task", 1), ("write", 1)]
    assert [todo["content"] for todo in condensed["todos"]] == ["Fix the parser", "Review the fix"]
    assert condensed["tasks"] == [{"id": "prt_t5", "text": "Review the fix", "status": "completed",
                                   "result": "The fix is correct."}]
    assert condensed["prompts"][0]["prompt"] == "Fix the failing parser test"


def test_opencode_samples_carry_the_fields_their_schemas_require() -> None:
    schemas = json.loads((FIXTURES / "opencode_event_schemas.json").read_text())["schemas"]
    parts = {"text": "TextPart", "reasoning": "ReasoningPart", "tool": "ToolPart", "step-finish": "StepFinishPart"}
    for line in lines("opencode_events.jsonl"):
        event = json.loads(line)
        schema = schemas[f"Event.{event['type']}"]["properties"]["properties"]
        assert set(schema.get("required", [])) <= set(event["properties"]), event["type"]
        part = event["properties"].get("part")
        if part:
            assert set(schemas[parts[part["type"]]]["required"]) <= set(part), part["id"]


# --- coding signals -----------------------------------------------------------------------------------------------


def record(kind: str, uuid: str, content: Any, **extra: Any) -> dict[str, Any]:
    """A transcript record as Claude Code writes it (the fields the converter reads)."""
    message: dict[str, Any] = {"role": kind, "content": content}
    if kind == "assistant":
        message["id"] = f"msg_{uuid}"
    return {"type": kind, "uuid": uuid, "sessionId": "s1", "cwd": ROOT, "isSidechain": False,
            "timestamp": f"2026-01-01T00:00:{len(uuid):02d}.000Z", "message": message, **extra}


def use(uuid: str, tool_id: str, name: str, tool_input: dict[str, Any]) -> dict[str, Any]:
    return record("assistant", uuid, [{"type": "tool_use", "id": tool_id, "name": name, "input": tool_input}])


def result(uuid: str, tool_id: str, text: str, error: bool = False, extra: Any = None) -> dict[str, Any]:
    item = {"type": "tool_result", "tool_use_id": tool_id, "content": text, "is_error": error}
    return record("user", uuid, [item], toolUseResult=extra if extra is not None else {"stdout": text})


def synthetic_transcript() -> list[dict[str, Any]]:
    """A failing pytest, two edits and a denied one, a passing pytest, and a Task subagent that edits a file."""
    return [
        record("user", "u1", "make the tests pass"),
        use("a1", "t1", "Bash", {"command": "pytest -q tests/"}),
        result("r1", "t1", "Exit code 1\nF\n1 failed in 0.10s", error=True),
        use("a2", "t2", "Edit", {"file_path": f"{ROOT}/src/app.py", "old_string": "a", "new_string": "b"}),
        result("r2", "t2", "The file has been updated.", extra={"filePath": f"{ROOT}/src/app.py"}),
        use("a3", "t3", "Write", {"file_path": f"{ROOT}/tests/test_new.py", "content": "def test(): pass\n"}),
        result("r3", "t3", "File created.", extra={"type": "create", "filePath": f"{ROOT}/tests/test_new.py"}),
        use("a4", "t4", "Edit", {"file_path": f"{ROOT}/README.md", "old_string": "x", "new_string": "y"}),
        result("r4", "t4", "Permission denied", error=True),
        use("a5", "t5", "Bash", {"command": "cd /repo && .venv/bin/python -m pytest -q"}),
        result("r5", "t5", "....\n4 passed in 0.20s"),
        use("a6", "t6", "Task", {"description": "Tidy imports", "prompt": "tidy", "subagent_type": "general"}),
        {"type": "progress", "parentToolUseID": "t6", "timestamp": "2026-01-01T00:01:00.000Z",
         "data": {"type": "agent_progress", "agentId": "ag1",
                  "message": use("s1", "t7", "Edit", {"file_path": f"{ROOT}/src/util.py"})}},
        {"type": "progress", "parentToolUseID": "t6", "timestamp": "2026-01-01T00:01:01.000Z",
         "data": {"type": "agent_progress", "agentId": "ag1", "message": result("s2", "t7", "ok", extra={})}},
        result("r6", "t6", "Imports tidied.", extra={"status": "completed", "agentId": "ag1", "totalToolUseCount": 1}),
        use("a7", "t8", "TodoWrite", {"todos": [{"content": "fix app", "status": "completed", "activeForm": "x"}]}),
    ]


def test_failing_then_passing_pytest_gives_broke_then_test_pass_with_the_edits_between() -> None:
    conv = converter("claude-code")
    events = [event for rec in synthetic_transcript() for event in conv.feed(rec)]
    signals = [event for event in events if event["type"] in ("modified", "broke", "test_pass")]
    assert [(event["type"], event.get("changeInfo")) for event in signals] == [
        ("broke", None),
        ("modified", {"elementType": "file", "entityIds": ["file:src/app.py"], "operation": "modified"}),
        ("modified", {"elementType": "file", "entityIds": ["file:tests/test_new.py"], "operation": "added"}),
        ("test_pass", None),
        ("modified", {"elementType": "file", "entityIds": ["file:src/util.py"], "operation": "modified"})]
    broke, passed = signals[0], signals[3]
    assert broke["stateTransition"] == {"to": "broken", "verifiedBy": "test"}
    assert broke["data"] == {"command": "pytest -q tests/", "toolUseId": "t1", "check": "test", "exitCode": 1}
    assert passed["stateTransition"] == {"to": "working", "verifiedBy": "test"} and passed["id"] == "t5:outcome"
    view = reduce(events).view()
    [sub] = view["subagents"]
    assert (sub["id"], sub["agentId"], sub["status"], sub["totalToolUseCount"]) == ("t6", "ag1", "completed", 1)
    assert [(b["id"], b["toolName"], b["status"]) for b in sub["blocks"]] == [("t7", "Edit", "complete")]
    condensed = view["condensed"]
    stamp = "2026-01-01T00:00:02.000Z"
    assert condensed["tools"] == [{"name": name, "count": count, "lastUsed": stamp} for name, count in (
        ("Edit", 3), ("Bash", 2), ("Task", 1), ("TodoWrite", 1), ("Write", 1))]
    assert condensed["todos"] == [{"content": "fix app", "status": "completed", "activeForm": "x"}]
    assert condensed["tasks"] == [{"id": "t6", "text": "Tidy imports", "status": "completed",
                                   "result": "Imports tidied."}]
    assert condensed["prompts"] == [{"prompt": "make the tests pass", "timestamp": "2026-01-01T00:00:02.000Z"}]


@pytest.mark.parametrize(("command", "kind"), [
    ("pytest -q", "test"), ("python -m pytest tests/x.py", "test"), ("uv run pytest", "test"),
    (".venv/bin/pytest -x", "test"), ("cd web && npm test", "test"), ("pnpm run test:unit", "test"),
    ("yarn test --watch=false", "test"), ("go test ./...", "test"), ("cargo test -p core", "test"),
    ("npx jest", "test"), ("npx vitest run", "test"), ("make test", "test"), ("CI=1 npm run build", "build"),
    ("cargo build --release", "build"), ("go build ./...", "build"), ("./gradlew test", "test"),
    ("FOO=a/b pytest", "test"), ("uv run ./node_modules/.bin/jest", "test"),
    ("ls -la", None), ("git commit -m 'pytest'", None), ("echo make test", None), ("mix phx.server", None)])
def test_test_and_build_commands_are_recognised(command: str, kind: str | None) -> None:
    assert check_kind(command) == kind


# --- robustness ---------------------------------------------------------------------------------------------------


def test_malformed_lines_are_counted_and_skipped() -> None:
    good = json.dumps(record("user", "u9", "hello"))
    bad = [
        '{"type": "user", "message": {"role": "user", "content": "trunc',  # truncated JSON
        "[1, 2, 3]",  # not an object
        '{"type": "user", "uuid": "w1", "message": {"content": 42}}',  # content of the wrong type
        '{"type": "assistant", "uuid": "w2", "message": "not an object"}',
        '{"type": "assistant", "uuid": "w3", "message": {"id": "m", "content": [{"type": "tool_use", "id": 5}]}}',
        '{"type": "mystery", "sessionId": "s"}',  # unknown type
        '{"type": "progress", "data": 7}',  # progress without data
        "",  # blank lines are not records
    ]
    result = convert_lines([good, *bad, good], fmt="claude-code")
    assert result.stats.as_dict() == {"records": 9, "events": 4, "capped": 0, "skipped": {
        "bad_json": 1, "not_an_object": 1, "user:bad_message": 1, "assistant:bad_message": 1, "content:tool_use": 1,
        "unknown_type:mystery": 1, "progress:None": 1}}
    assert [event["type"] for event in result.events] == ["block:upsert", "query:started"] * 2


def test_a_huge_tool_result_or_input_is_capped_with_a_marker_and_counted() -> None:
    conv = converter("claude-code")
    events = conv.feed(use("a1", "big", "Write", {"file_path": f"{ROOT}/big.txt", "content": "x" * 100_000}))
    events += conv.feed(result("r1", "big", "y" * 1_000_000))
    assert conv.stats.capped == 2
    for event in events:
        assert encoded_size(event["data"]) <= 16 * 1024 and encoded_size(event) <= 64 * 1024
    assert events[0]["data"]["block"]["input"]["content"].endswith("…[truncated 95904 chars]")
    assert events[1]["data"]["block"]["output"] == "y" * 4096 + "…[truncated 995904 chars]"


def test_values_no_backend_can_store_are_replaced() -> None:
    assert clean({"a": float("nan"), "b": 2e12, "c": "x\x00y", "d": [float("inf"), 5], "e": True}) == {
        "a": None, "b": "2000000000000.0", "c": "xy", "d": [None, 5], "e": True}


def test_the_ingest_commands_fast_parser_and_encoder_give_the_same_events_as_the_standard_librarys() -> None:
    """`memento-sessions ingest` parses and checks with pydantic-core, which writes NaN and Infinity where the
    standard library's strict encoder refuses them: the events must come out the same, every value storable."""
    from memento_sessions.cli.ingest import encode_fast, parse_fast
    from memento_sessions.ingest import LineReader

    awkward = [use("a1", "n1", "Write", {"file_path": f"{ROOT}/a.py", "content": "x\x00y", "n": float("nan")}),
               use("a2", "n2", "Write", {"file_path": f"{ROOT}/b.py", "content": "ok", "big": 2e13,
                                         "inf": [float("-inf")], "e": 1.5e-7}),
               use("a3", "n3", "Write", {"file_path": f"{ROOT}/c.py", "content": "z" * 40_000}),
               result("r1", "n1", "done"), result("r2", "n2", "NaN, Infinity and 12345678901234 in a string"),
               record("user", "u1", "plain")]
    text = [json.dumps(item) for item in awkward] + ['{"type": "user", "trunc']
    slow, fast = LineReader("claude-code"), LineReader("claude-code", parse=parse_fast, encode=encode_fast)
    slow_events = [event for line in text for event in slow.feed(line)]
    fast_events = [event for line in text for event in fast.feed(line)]
    assert fast_events == slow_events and fast.finish().as_dict() == slow.finish().as_dict()
    inputs = [event["data"]["block"]["input"] for event in slow_events[:3]]
    assert inputs[0] == {"file_path": f"{ROOT}/a.py", "content": "xy", "n": None}
    assert inputs[1] == {"file_path": f"{ROOT}/b.py", "content": "ok", "big": "20000000000000.0", "inf": [None],
                         "e": 1.5e-7}
    assert inputs[2]["content"].endswith("…[truncated 35904 chars]")
    assert encode_fast(slow_events[4]["data"]) == json.dumps(slow_events[4]["data"], separators=(",", ":")).encode()
    encoded = LineReader("claude-code", parse=parse_fast, encode=encode_fast)
    as_bytes = [event for line in text for event in encoded.feed_encoded(line)]
    assert [json.loads(event) for event in as_bytes] == slow_events, "the same events, the checked data spliced in"
    assert all(event.startswith(b'{"id":') for event in as_bytes), "each leads with its id: the client retries them"
    assert encoded.finish().as_dict() == slow.finish().as_dict()


def test_an_input_read_a_chunk_at_a_time_gives_the_lines_one_read_would(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from memento_sessions.cli import ingest as cli_ingest

    path = tmp_path / "t.jsonl"
    for data in (b'{"a": 1}\n\n{"b": "x\xe2\x80\xa8y"}\r\n{"c"', b'{"a": 1}\n{"b": 2}\n', b"", b"\n\n"):
        path.write_bytes(data)
        for chunk in (1, 2, 3, 7, 1 << 20):
            monkeypatch.setattr(cli_ingest, "CHUNK", chunk)
            assert list(cli_ingest.read_input(str(path))) == data.split(b"\n"), (data, chunk)


def test_the_ingest_command_cuts_lines_at_newlines_only_and_reads_bad_utf8_as_replacement_chars(
        tmp_path: Path) -> None:
    """`memento-sessions ingest` reads bytes: a raw U+2028 or NEL inside a JSON string (where str.splitlines cuts)
    keeps its record whole; a byte that is not UTF-8 reads as U+FFFD, as when the file was decoded first."""
    from memento_sessions.cli.ingest import encode_fast, parse_fast, read_input
    from memento_sessions.ingest import LineReader

    first = json.dumps(record("user", "u1", "one\u2028two\x85three"), ensure_ascii=False).encode()
    broken = json.dumps(record("user", "u2", "raw BYTE")).encode().replace(b"BYTE", b"\xff")
    path = tmp_path / "t.jsonl"
    path.write_bytes(first + b"\r\n\xc2\xa0\n" + broken + b"\n{\"trunc\n\n")
    raw = list(read_input(str(path)))
    assert len(raw) == 6  # the record, a blank line (NBSP), the broken one, the truncated one, two empty
    reader = LineReader("claude-code", parse=parse_fast, encode=encode_fast)
    events = [json.loads(event) for line in raw for event in reader.feed_encoded(line)]
    assert [event["data"]["block"]["content"] for event in events if event["type"] == "block:upsert"] == [
        "one\u2028two\x85three", "raw \ufffd"]
    assert reader.finish().as_dict() == {"records": 3, "events": 4, "capped": 0, "skipped": {"bad_json": 1}}
    text = [line.decode("utf-8", "replace") for line in raw]
    slow = LineReader("claude-code")
    assert [event for line in text for event in slow.feed(line)] == events, "bytes or text: the same events"


def test_unknown_fields_and_a_broken_record_never_stop_the_stream() -> None:
    stats = Stats()
    for _ in range(200):
        stats.skip(f"unknown_type:{_}")
    assert len(stats.skipped) == 101 and stats.skipped["other"] == 100


# --- parity and determinism ---------------------------------------------------------------------------------------


def stream_json_live() -> list[dict[str, Any]]:
    """The gleam sample as `--include-partial-messages` streams it: the text arrives in deltas first."""
    init, assistant, done = (json.loads(line) for line in lines("gleam_basic_query.ndjson"))
    thinking = {"type": "thinking", "thinking": "Two plus two."}
    assistant["message"]["content"] = [thinking, *assistant["message"]["content"]]
    msg = assistant["message"]["id"]

    def event(inner: dict[str, Any]) -> dict[str, Any]:
        return {"type": "stream_event", "event": inner, "session_id": init["session_id"], "parent_tool_use_id": None}

    partial = [event({"type": "message_start", "message": {"id": msg, "content": []}}),
               event({"type": "content_block_start", "index": 0,
                      "content_block": {"type": "thinking", "thinking": ""}}),
               event({"type": "content_block_delta", "index": 0,
                      "delta": {"type": "thinking_delta", "thinking": "Two "}}),
               event({"type": "content_block_delta", "index": 0,
                      "delta": {"type": "thinking_delta", "thinking": "plus two."}}),
               event({"type": "content_block_stop", "index": 0}),
               event({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}),
               event({"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "4"}}),
               event({"type": "content_block_stop", "index": 1}), event({"type": "message_stop"})]
    # Claude Code writes one record per content block of a message.
    first = {**assistant, "message": {**assistant["message"], "content": [thinking]}}
    second = {**assistant, "message": {**assistant["message"], "content": assistant["message"]["content"][1:]}}
    return [init, *partial, first, second, done]


def test_live_stream_and_loaded_transcript_give_the_same_state_stream_json() -> None:
    live = stream_json_live()
    loaded = [rec for rec in live if rec["type"] != "stream_event"]
    live_events = convert_lines([json.dumps(rec) for rec in live]).events
    loaded_events = convert_lines([json.dumps(rec) for rec in loaded]).events
    assert by_type(live_events)["block:delta"] == 3 and by_type(loaded_events)["block:delta"] == 0
    midway = reduce(live_events[:6]).view()["blocks"]  # init events, both pending blocks, the thinking deltas
    assert [(b["content"], b["status"]) for b in midway] == [("Two plus two.", "pending"), ("", "pending")]
    assert reduce(live_events).view() == reduce(loaded_events).view()
    assert [(b["kind"], b["content"]) for b in blocks_of(loaded_events)] == [("thinking", "Two plus two."),
                                                                             ("assistant_text", "4")]


def test_live_stream_and_loaded_session_give_the_same_state_opencode() -> None:
    live = [json.loads(line) for line in lines("opencode_events.jsonl")]
    final: dict[str, Any] = {}
    for rec in live:
        if rec["type"] == "message.part.updated":
            final[rec["properties"]["part"]["id"]] = rec
    loaded, placed = [], set()
    for rec in live:  # a loaded session: each part once, finished, where it began; no deltas
        if rec["type"] == "message.part.delta":
            continue
        if rec["type"] == "message.part.updated":
            part_id = rec["properties"]["part"]["id"]
            if part_id in placed:
                continue
            placed.add(part_id)
            rec = final[part_id]
        loaded.append(rec)
    assert len(loaded) == len(live) - 6  # two deltas and the earlier versions of prt_r1, prt_t1, prt_t2, prt_t5
    live_view = reduce(convert_lines([json.dumps(rec) for rec in live]).events).view()
    assert live_view == reduce(convert_lines([json.dumps(rec) for rec in loaded]).events).view()


@pytest.mark.parametrize("name", ["spotter_tool_heavy.jsonl", "gleam_basic_query.ndjson", "opencode_events.jsonl"])
def test_event_ids_are_deterministic_valid_and_unique(name: str) -> None:
    first, second = convert_lines(lines(name)).events, convert_lines(lines(name)).events
    assert first == second
    assert len({event["id"] for event in first}) == len(first)
    for event in first:
        assert ID.match(event["id"]) and TYPE.match(event["type"])
        assert set(event) <= {"id", "type", "timestamp", "changeInfo", "stateTransition", "impact", "data"}


def test_long_or_foreign_source_ids_still_make_valid_event_ids() -> None:
    conv = converter("claude-code")
    events = conv.feed(record("user", "ü/" + "x" * 300, "hi"))
    assert len(events) == 2 and all(ID.fullmatch(event["id"]) for event in events)
    assert events[0]["id"] != events[1]["id"]


def test_a_source_id_ending_in_a_newline_is_not_taken_as_it_is() -> None:
    """`$` matches before a trailing newline: such an id passed as valid and the daemon refused the event."""
    events = converter("claude-code").feed(record("user", "u-1\n", "hi"))
    assert events and all(ID.fullmatch(event["id"]) for event in events)


# --- hook input ---------------------------------------------------------------------------------------------------


def hook(name: str, **fields: Any) -> dict[str, Any]:
    return {"session_id": "s1", "transcript_path": "/tmp/t.jsonl", "cwd": ROOT, "permission_mode": "default",
            "hook_event_name": name, **fields}


def test_hook_tool_events_share_the_transcripts_ids() -> None:
    edit = {"file_path": f"{ROOT}/src/app.py", "old_string": "a", "new_string": "b"}
    pre, _ = convert_hook(hook("PreToolUse", tool_name="Edit", tool_input=edit, tool_use_id="t2"))
    post, stats = convert_hook(hook("PostToolUse", tool_name="Edit", tool_input=edit, tool_use_id="t2",
                                    tool_response={"filePath": f"{ROOT}/src/app.py", "success": True}))
    transcript = converter("claude-code")
    from_transcript = [e for rec in synthetic_transcript()[3:5] for e in transcript.feed(rec)]
    assert [e["id"] for e in pre + post] == [e["id"] for e in from_transcript] == ["t2:use", "t2:result", "t2:modified"]
    assert post[1]["changeInfo"] == {"elementType": "file", "entityIds": ["file:src/app.py"], "operation": "modified"}
    assert stats.as_dict() == {"records": 1, "events": 2, "capped": 0, "skipped": {}}


def test_hook_test_outcomes_from_post_tool_use_and_its_failure() -> None:
    run = {"command": "pytest -q"}
    unknown, _ = convert_hook(hook("PostToolUse", tool_name="Bash", tool_input=run, tool_use_id="b0",
                                   tool_response={"stdout": "1 passed", "stderr": "", "interrupted": False}))
    passed, _ = convert_hook(hook("PostToolUse", tool_name="Bash", tool_input=run, tool_use_id="b1",
                                  tool_response={"stdout": "1 passed", "stderr": "", "exit_code": 0}))
    nonzero, _ = convert_hook(hook("PostToolUse", tool_name="Bash", tool_input=run, tool_use_id="b4",
                                   tool_response={"stdout": "1 failed", "stderr": "", "exitCode": 2}))
    failed, _ = convert_hook(hook("PostToolUseFailure", tool_name="Bash", tool_input=run, tool_use_id="b2",
                                  error="Exit code 1\n1 failed"))
    stopped, _ = convert_hook(hook("PostToolUse", tool_name="Bash", tool_input=run, tool_use_id="b3",
                                   tool_response={"stdout": "", "stderr": "", "interrupted": True}))
    assert [e["type"] for e in unknown] == ["block:upsert"]  # no exit code: the outcome is unknown, not a pass
    assert [e["type"] for e in passed] == ["block:upsert", "test_pass"] and passed[1]["data"]["exitCode"] == 0
    assert [e["type"] for e in nonzero] == ["block:upsert", "broke"] and nonzero[1]["data"]["exitCode"] == 2
    assert passed[0]["data"]["block"]["output"] == "1 passed"
    assert [e["type"] for e in failed] == ["block:upsert", "broke"] and failed[1]["data"]["exitCode"] == 1
    assert [e["type"] for e in stopped] == ["block:upsert"]


def test_hook_inputs_without_ids_depend_on_when_they_were_read() -> None:
    stop = hook("Stop", stop_hook_active=False)
    first, _ = convert_hook(stop, at="2026-01-01T00:00:00Z")
    again, _ = convert_hook(stop, at="2026-01-01T00:00:00Z")
    later, _ = convert_hook(stop, at="2026-01-01T00:05:00Z")
    assert [e["type"] for e in first] == ["query:completed", "session:idle"]
    assert [e["id"] for e in first] == [e["id"] for e in again] != [e["id"] for e in later]
    assert first[0]["timestamp"] == "2026-01-01T00:00:00Z"


def test_every_documented_hook_event_converts() -> None:
    inputs = [hook("SessionStart", source="startup"), hook("UserPromptSubmit", prompt="add login"),
              hook("PreToolUse", tool_name="Task", tool_use_id="k1",
                   tool_input={"description": "Explore", "prompt": "look", "subagent_type": "Explore"}),
              hook("SubagentStop", agent_id="ag7", agent_type="Explore", stop_hook_active=False,
                   last_assistant_message="found it"),
              hook("PreCompact", trigger="auto", custom_instructions=""),
              hook("Notification", message="Claude needs your permission"), hook("Stop", stop_hook_active=False),
              hook("SomethingNew", extra=1), {"session_id": "s1"}, "not a dict"]
    events, skipped = [], Counter[str]()
    for item in inputs:
        out, stats = convert_hook(item, at="2026-01-01T00:00:00Z")
        events += out
        skipped.update(stats.skipped)
    assert [e["type"] for e in events] == [
        "metadata:update", "block:upsert", "query:started", "block:upsert", "subagent:spawned", "subagent:completed",
        "metadata:update", "metadata:update", "query:completed", "session:idle", "metadata:update"]
    assert skipped == {"hook:no_event_name": 1, "not_an_object": 1}
    view = reduce(events).view()
    assert view["subagents"][0]["agentType"] == "Explore" and view["condensed"]["prompts"][0]["prompt"] == "add login"
    assert view["subagents"][0]["status"] == "running"  # SubagentStop names ag7, which no Task result linked to k1
    assert view["subagents"][1] == {"id": "ag7", "status": "completed", "agentId": "ag7", "agentType": "Explore",
                                    "result": "found it", "completedAt": "2026-01-01T00:00:00Z", "blocks": []}


def test_the_package_imports_only_the_standard_library() -> None:
    code = ("import sys, memento_sessions.ingest; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'pydantic', 'redis', 'anyio', 'structlog'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
