"""`memento-sessions hook`: one Claude Code hook input on stdin -> its events in the agent's session.

Always spool first, then deliver: the input is appended (with the time it was read and the project
directory) to `<data dir>/hook-spool/spool.jsonl` under an exclusive lock, then the hook sends every
spooled input not yet delivered, oldest first, within its time budget. Nothing is lost while the daemon
is down (the next hook call delivers the backlog, or `memento-sessions hook --flush`), and nothing is
doubled: the events' ids derive from the input and the time it was read, the daemon writes an id once
per session, and the delivered offset is committed after each batch, so a batch sent again after a
crash writes nothing. Only one hook delivers at a time (a second lock); the others just spool. It reads
the backlog a chunk at a time and stops at its deadline, so a call's time and memory do not grow with the
backlog, and the spool is capped (cli/spool.py). A session that is not live is resumed when it was
suspended, else created (never created over a suspended one).

When the spool holds nothing but this input, one POST to the daemon's /hooks/claude-code stores it and brings
the answer (cli/post.py); else, before delivering, it asks the daemon for its answer (`hook.answer`: what the
swarm has to tell this agent, and for an edit the lease policy's decision). It prints the answer, Claude
Code's hook JSON output, on stdout; nothing else ever goes there, and nothing at all when there is nothing to
say, the input is not a hook input or the daemon is away (an allow). It exits 0 whatever happens. Its imports
are the standard library (JSON from `_json`: fastjson.py), and the pure converters and a small WebSocket
client only when it delivers a backlog, so it is done within 200 ms
including the interpreter's start. Configuration comes from the environment only (reading .env and
validating every setting would cost more than the budget): MEMENTO_TOKEN, MEMENTO_DATA_DIR, and where the
daemon is by every command's rule (the port in `<data dir>/runtime.json`, else MEMENTO_URL, else
MEMENTO_HOST / MEMENTO_PORT); MEMENTO_HOOK_LEASES and MEMENTO_HOOK_CLAIM_TTL, when set, choose this project's
lease policy and claim over the daemon's defaults; CLAUDE_PROJECT_DIR (set by Claude Code) is the project root.
"""

from __future__ import annotations

import fcntl
import os
import sys
import time

from memento_sessions.cli import fastjson
from memento_sessions.cli.spool import (
    MAX_INPUT,
    Locked,
    compact,
    note_dropped,
    parse,
    pending,
    read_offset,
    spool,
    trim,
    write_offset,
)

# Not even typing, argparse, datetime, pathlib or contextlib at import: paths are plain strings, the lock a
# small class (with an editable install whose finder imports pathlib anyway, only a lighter install shows the
# gain). mypy takes any name TYPE_CHECKING as true.
TYPE_CHECKING = False
if TYPE_CHECKING:  # imported when delivering: a hook that only spools does without the socket modules
    import argparse
    from collections.abc import Iterator
    from typing import Any, NoReturn

    from memento_sessions.cli.wire import RpcFailure, Wire


STARTED = time.monotonic()
BUDGET = 0.15  # seconds from the start of the process a hook may spend (the daemon-up target is 0.2)
ANSWER_BUDGET = 2.0  # seconds from the start a hook waits for its answer (then: allowed, nothing said)
POLICIES = ("off", "warn", "enforce")
# ingest.claude_hooks.HOOK_EVENTS, spelled out: importing the converters costs a spooling-only hook (a test
# keeps the two equal).
EVENTS = ("SessionStart", "UserPromptSubmit", "PreToolUse", "PostToolUse", "PostToolUseFailure", "SubagentStart",
          "SubagentStop", "Stop", "PreCompact", "Notification", "SessionEnd")
BATCH = 200  # events per event.emitBatch
GROUP = 1024 * 1024  # bytes of spooled inputs of one session sent in one event.emitBatch (under the frame limit)
NOT_FOUND, INVALID, CONFLICT = -32004, -32602, -32009
HELP = """\
Put it in Claude Code's hook settings (.claude/settings.json) for the events you want recorded; the
README has the block to paste. Environment: MEMENTO_TOKEN (the agent's token), MEMENTO_DATA_DIR (the
daemon's data dir: its spool and runtime.json). The daemon: the port in the data dir's runtime.json (a
running daemon writes it), else MEMENTO_URL (ws://host:port/ws), else MEMENTO_HOST / MEMENTO_PORT.
MEMENTO_HOOK_SPOOL_MAX_BYTES (default 32 MiB) caps what waits in the spool: past it the oldest inputs are
dropped, counted in hook-spool/dropped and said once on stderr.
"""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `hook` command (the parser of `--help`; `run_hook` itself does not parse arguments)."""
    import argparse

    hook = sub.add_parser("hook", help="for Claude Code's hooks: one hook input on stdin -> events (spooled when "
                          "the daemon is down)", description=__doc__.split("\n\n")[1], epilog=HELP,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    hook.add_argument("--flush", action="store_true", help="read no input; deliver everything spooled, "
                      "without a time budget (exit 1 when something is left)")
    hook.add_argument("--gemini", action="store_true", help="the input is a Gemini CLI hook's, and so is the "
                      "output (always a JSON object: {} when there is nothing to say)")


def spool_dir() -> str:
    return os.path.join(os.environ.get("MEMENTO_DATA_DIR") or ".memento", "hook-spool")


def daemon_url() -> str:
    """The daemon, by every command's rule (cli/wire.py\'s daemon_url): the data dir's runtime.json, else
    MEMENTO_URL, else MEMENTO_HOST / MEMENTO_PORT."""
    from memento_sessions.cli.wire import daemon_url as find

    env = os.environ
    return find(os.path.dirname(spool_dir()), env.get("MEMENTO_URL"), env.get("MEMENTO_HOST"), env.get("MEMENTO_PORT"))


def events_of(entry: dict[str, Any]) -> tuple[str | None, list[dict[str, Any]]]:
    """The session id and the events of one spooled input (imported here: only a delivery needs them)."""
    from memento_sessions.cli.gitstate import DEFERRED, git_events
    from memento_sessions.ingest.claude_hooks import convert_hook
    from memento_sessions.ingest.events import _ID_OK

    record = entry.get("input")
    sid = record.get("session_id") if isinstance(record, dict) else None
    if not isinstance(record, dict) or not isinstance(sid, str) or not _ID_OK.match(sid):
        return None, []
    if record.get(DEFERRED):  # stamps a detached child took: no hook event of their own
        return sid, git_events(entry)
    events, _ = convert_hook(record, at=entry.get("at"), project_root=entry.get("root"))
    return sid, events + git_events(entry)


class Spooled:
    """One spooled line: where it ends in the spool, its entry, its size, and (once converted) its events."""

    __slots__ = ("end", "entry", "events", "sid", "size")

    def __init__(self, end: int, line: bytes) -> None:
        self.end, self.entry, self.size = end, parse(line), len(line)
        self.sid, self.events = events_of(self.entry)


def send(wire: Wire, sid: str, events: list[dict[str, Any]]) -> None:
    """Emit the events into the session, bringing it back (resumed, else created) when it is not live;
    RpcFailure for a refusal."""
    from memento_sessions.cli.wire import RpcFailure

    for start in range(0, len(events), BATCH):
        batch = {"sessionId": sid, "events": events[start:start + BATCH]}
        try:
            wire.call("event.emitBatch", batch)
        except RpcFailure as exc:
            if exc.code != NOT_FOUND:
                raise
            reopen(wire, sid)
            wire.call("event.emitBatch", batch)


def reopen(wire: Wire, sid: str) -> None:
    """A session that is not live: resume it when it was suspended (`session suspend`, then a resumed Claude
    session), else create it. Never a create over a suspended session: that would shadow its events."""
    from memento_sessions.cli.wire import RpcFailure

    if resume(wire, sid):
        return
    try:
        wire.call("session.create", {"sessionId": sid})
    except RpcFailure as created:
        if created.code != CONFLICT:
            raise
        if reason(created) == "suspended":  # suspended meanwhile: the daemon refuses a create onto its id
            resume(wire, sid)
        # else another hook created it meanwhile: fine


def resume(wire: Wire, sid: str) -> bool:
    """True when the session is live after a `session.resume` (by this call or another hook's), False when
    there is nothing to resume; RpcFailure when it cannot be (completed, archived)."""
    from memento_sessions.cli.wire import RpcFailure

    try:
        wire.call("session.resume", {"sessionId": sid})
    except RpcFailure as exc:
        if exc.code == NOT_FOUND:
            return False
        if exc.code == CONFLICT and reason(exc) == "active":
            return True
        raise
    return True


def reason(exc: RpcFailure) -> object:
    return exc.data.get("reason") if isinstance(exc.data, dict) else None


def refused_for_good(exc: RpcFailure) -> bool:
    """Invalid input, or a session that takes no more events (a conflict: completed, archived): set aside,
    as waiting would block the spool forever. Anything else (rate, backend, full) may pass later."""
    return exc.code in (INVALID, CONFLICT)


def deliver(folder: str, deadline: float, kept: dict[str, Wire] | None = None) -> bool:
    """Trim the spool to its cap, then send the spooled inputs in order, a chunk at a time, until done or the
    deadline; True when nothing is left. `kept`: connections already open, by session (the answer's)."""
    os.makedirs(folder, mode=0o700, exist_ok=True)
    try:
        with Locked(os.path.join(folder, "deliver.lock"), os.O_WRONLY | os.O_CREAT, fcntl.LOCK_EX | fcntl.LOCK_NB):
            note_dropped(folder, trim(folder))
            token = os.environ.get("MEMENTO_TOKEN")
            if not token:
                return False
            from memento_sessions.cli.wire import WireError

            try:
                return _deliver(folder, Wires(daemon_url(), token, deadline, kept or {}))
            except WireError:  # the daemon is away, or the deadline came
                return False
    except BlockingIOError:  # another hook is delivering
        return False


class Wires:
    """One connection per Claude Code session, opened when first needed: each session's events are its own
    agent's (the daemon derives it from the token and `?session=`)."""

    def __init__(self, url: str, token: str, deadline: float, kept: dict[str, Wire]) -> None:
        self.url, self.token, self.deadline = url, token, deadline
        self.open: dict[str, Wire] = {}
        while kept:  # taken over: closed with the others
            sid, wire = kept.popitem()
            wire.deadline, self.open[sid] = deadline, wire

    def of(self, sid: str) -> Wire:
        from memento_sessions.cli.wire import Wire

        if sid not in self.open:
            self.open[sid] = Wire(self.url, self.token, self.deadline, sid)
        return self.open[sid]

    def remaining(self) -> float:
        from memento_sessions.cli.wire import WireError

        left = self.deadline - time.monotonic()
        if left <= 0:
            raise WireError("deadline passed")
        return left

    def close(self) -> None:
        for wire in self.open.values():
            wire.close()


def _deliver(folder: str, wire: Wires) -> bool:
    try:
        while True:
            wire.remaining()  # WireError once the deadline has come: the rest waits for the next call
            entries = [Spooled(end, line) for end, line in pending(folder, read_offset(folder))]
            if not entries:
                compact(folder)
                return True
            for group in groups(entries):
                if not send_group(folder, wire, group):
                    return False
                write_offset(folder, group[-1].end)
            if len(entries) > 1:
                note_dropped(folder, trim(folder))  # inputs spooled meanwhile (a long --flush)
    finally:
        wire.close()


def groups(entries: list[Spooled]) -> Iterator[list[Spooled]]:
    """Consecutive inputs of one session, up to BATCH events and GROUP bytes: one event.emitBatch each."""
    group: list[Spooled] = []
    for item in entries:
        head = next((spooled for spooled in group if spooled.sid), None)
        fits = head is None or not item.sid or (
            item.sid == head.sid and sum(len(spooled.events) for spooled in group) + len(item.events) <= BATCH
            and sum(spooled.size for spooled in group) + item.size <= GROUP)
        if not fits:
            yield group
            group = []
        group.append(item)
    if group:
        yield group


def send_group(folder: str, wires: Wires, group: list[Spooled]) -> bool:
    """Send a group's events; an input refused for good is set aside (one by one when the group is refused).
    False when a refusal is for now: try again later."""
    from memento_sessions.cli.wire import RpcFailure

    sid = next((item.sid for item in group if item.sid), None)
    events = [event for item in group for event in item.events]
    if sid is None or not events:
        return True
    try:
        send(wires.of(sid), sid, events)
        return True
    except RpcFailure as exc:
        if not refused_for_good(exc):  # refused for now (rate, backend, full)
            return False
        if len(group) == 1:
            reject(folder, group[0].entry, exc)
            return True
    return all(send_group(folder, wires, [item]) for item in group)


def reject(folder: str, entry: dict[str, Any], exc: RpcFailure) -> None:
    """Keep an input the daemon refuses as invalid in rejected.jsonl, with the reason."""
    import json  # a rejection is rare: the lean path's fastjson has no `default`

    line = json.dumps({"error": str(exc), "data": exc.data, **entry}, ensure_ascii=False, default=str)
    with Locked(os.path.join(folder, "rejected.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT) as fd:
        os.write(fd, (line + "\n").encode())


def answer_params(record: Any) -> dict[str, Any]:
    """hook.answer's params: the input, and this project's root, lease policy and claim when set."""
    env = os.environ
    params: dict[str, Any] = {"input": record}
    if env.get("CLAUDE_PROJECT_DIR"):
        params["root"] = env["CLAUDE_PROJECT_DIR"][:4096]
    if env.get("MEMENTO_HOOK_LEASES") in POLICIES:
        params["leases"] = env["MEMENTO_HOOK_LEASES"]
    ttl = env.get("MEMENTO_HOOK_CLAIM_TTL", "")
    if ttl.isdigit() and int(ttl) <= 3600:
        params["claimTtl"] = int(ttl)
    return params


def answer(record: Any, kept: dict[str, Wire]) -> dict[str, Any] | None:
    """The daemon's hook output for the input (None: nothing to say, or no daemon to ask). Its connection, the
    session's own agent's, is kept in `kept` for the delivery that follows."""
    token = os.environ.get("MEMENTO_TOKEN")
    sid = record.get("session_id") if isinstance(record, dict) else None
    if not token or not isinstance(sid, str):
        return None
    from memento_sessions.cli.wire import RpcFailure, Wire, WireError

    try:
        wire = Wire(daemon_url(), token, STARTED + ANSWER_BUDGET, sid)
        try:
            result = wire.call("hook.answer", answer_params(record))
        except BaseException:
            wire.close()
            raise
    except (WireError, RpcFailure, OSError):
        return None
    kept[sid] = wire
    output = result.get("output") if isinstance(result, dict) else None
    return output if isinstance(output, dict) and output else None


def read_input() -> Any:
    """stdin's hook input; None when it is empty, too large or not JSON."""
    raw = sys.stdin.buffer.read(MAX_INPUT + 1)
    if not raw.strip() or len(raw) > MAX_INPUT:
        return None
    try:
        return fastjson.loads(raw)
    except ValueError:
        return None


def gemini_input(record: Any) -> Any:
    """A Gemini CLI hook input as the Claude Code one it means."""
    from memento_sessions.ingest.gemini_hooks import to_claude

    return to_claude(record)


def gemini_answer(said: dict[str, Any] | None) -> dict[str, Any]:
    from memento_sessions.ingest.gemini_hooks import gemini_output

    return gemini_output(said or {})


def is_hook_input(record: Any) -> bool:
    """An object naming a hook event the daemon knows (a newer Claude Code's other events are left alone)."""
    return isinstance(record, dict) and record.get("hook_event_name") in EVENTS


def run_hook(argv: list[str]) -> int:
    """The command: spool stdin's input (unless --flush), print the daemon's answer, then deliver; 0 whatever
    happened, but for --flush with something left (1)."""
    folder = spool_dir()
    flush, gemini, answering, delivered = "--flush" in argv, "--gemini" in argv, 0.0, False
    kept: dict[str, Wire] = {}
    try:
        if not flush:
            record = read_input()
            if gemini:
                record = gemini_input(record)
            if not is_hook_input(record):  # nothing to keep, nothing to say, nothing written
                if gemini:
                    sys.stdout.write("{}")  # Gemini CLI reads any other stdout as a message to show
                return 0
            from memento_sessions.cli import gitstate  # a commit now; the git state and uncommitted work by a child

            gitstate.stamp(record, slow=False)
            at, start, end = spool(record, folder)
            if gitstate.deferred(record):
                from memento_sessions.cli.stamp import spawn

                spawn(record, at, folder)
            asked = time.monotonic()
            from memento_sessions.cli.post import NOT_TAKEN, post_input

            posted = post_input(record, at, start, end, folder)
            said = answer(record, kept) if posted is NOT_TAKEN else posted.answer
            delivered = posted.recorded
            if said or gemini:
                sys.stdout.write(fastjson.dumps(gemini_answer(said) if gemini else said))
                sys.stdout.flush()
            answering = time.monotonic() - asked  # not taken from the delivery's budget
        else:
            from memento_sessions.cli.stamp import wait_for_children

            wait_for_children(folder)  # the stamps detached children are still taking
        # A posted input recorded: this call's part is done (what others spooled meanwhile, they deliver).
        done = delivered or deliver(folder, STARTED + BUDGET + answering if not flush else time.monotonic() + 3600,
                                    kept)
    except Exception:  # a hook must never fail the agent's tool call, nor print to it
        return 0
    finally:
        for wire in kept.values():  # not taken over by a delivery (another hook is delivering)
            wire.close()
    return 0 if done or not flush else 1


def leave(code: int) -> NoReturn:
    """End the process now, skipping the interpreter's teardown (clearing every module, a last garbage
    collection): 7-10 ms of CPU measured on the hook's process, a fifth of what it costs beyond the bare
    interpreter. Nothing is lost: the hook has closed every file and the socket, registers no atexit
    handler, and prints nothing (stdout and stderr are flushed all the same)."""
    try:  # not contextlib.suppress: contextlib is an import the hook does without
        sys.stdout.flush()
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):  # no stream, or a closed or broken one: nothing to flush to
        pass
    os._exit(code)
