"""`memento-sessions ingest FILE...`: agents' transcripts and event logs into sessions, through event.emitBatch.

Each input (a file, every *.jsonl / *.ndjson / *.json under a directory, a glob, or `-` for stdin) is
converted by memento_sessions.ingest (format detected from its first telling record, or given), then
sent in batches to the daemon. Event ids derive from the source records, so ingesting the same input
again writes nothing new: the summary counts those events as already there. A line that is not JSON,
a record of an unknown type or a malformed one is counted by reason and skipped; it never ends the run.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
from collections import Counter
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import anyio

from memento_sessions.client import Client
from memento_sessions.client.wire import MAX_FRAME
from memento_sessions.errors import Conflict, NotFound
from memento_sessions.ingest import FORMATS, convert_lines
from memento_sessions.settings import Settings

BATCH = 500  # events per event.emitBatch (the method's maximum)
FRAME_BUDGET = MAX_FRAME - 64 * 1024  # bytes of one batch's events: room for the request around them
SUFFIXES = (".jsonl", ".ndjson", ".json")
SESSION_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
EPILOG = """\
The daemon: --url (or MEMENTO_URL), else the daemon running on the data dir (its runtime.json).
The identity: MEMENTO_TOKEN, a token with sessions:write (`memento-sessions token --agent ID`).
Each input goes into the session --session names, else the one its records name (a Claude Code
transcript's sessionId, stream-json's session_id), else one named after the file; created when missing.

examples:
  memento-sessions ingest ~/.claude/projects/-home-me-app/*.jsonl
  claude -p "fix the tests" --output-format stream-json --verbose | memento-sessions ingest - --session fix-1
  memento-sessions ingest logs/ --format opencode
"""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `ingest` command."""
    ingest = sub.add_parser("ingest", help="load agents' transcripts and event logs (Claude Code, stream-json, "
                            "OpenCode) into sessions", description=__doc__.split("\n\n")[1], epilog=EPILOG,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    ingest.add_argument("files", nargs="+", metavar="FILE", help="files, directories, globs, or - for stdin")
    ingest.add_argument("--session", type=_session_id, help="the session to ingest into (every input)")
    ingest.add_argument("--format", default="auto", choices=["auto", *sorted(set(FORMATS) - {"hook"}), "hook"],
                        help="the inputs' format (default: auto, detected from the records)")
    ingest.add_argument("--project-root", help="make file paths relative to this directory (default: the "
                        "directory the records name, e.g. a transcript's cwd)")
    ingest.add_argument("--url", help="the daemon's WebSocket URL (MEMENTO_URL; default: the local daemon of "
                        "the data dir)")
    ingest.add_argument("--data-dir", help="the running daemon's data dir (MEMENTO_DATA_DIR, default ./.memento)")
    ingest.set_defaults(func=ingest_command)


def _session_id(value: str) -> str:
    if not SESSION_ID.match(value):
        raise argparse.ArgumentTypeError("a session id is 1..128 chars of [A-Za-z0-9._:-]")
    return value


@dataclass
class Totals:
    """What the run did, over every input."""

    inputs: int = 0
    records: int = 0
    written: int = 0
    already: int = 0  # events the session held already (a re-ingest)
    capped: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    failed: list[str] = field(default_factory=list)

    def line(self) -> str:
        """The summary line of the run."""
        skipped = ", ".join(f"{reason} {count}" for reason, count in self.skipped.most_common()) or "none"
        text = (f"ingested {self.inputs} input(s): {self.records} records read, {self.written} events written, "
                f"{self.already} already there, {self.capped} capped; skipped {sum(self.skipped.values())} "
                f"({skipped})")
        return text + (f"; failed: {'; '.join(self.failed)}" if self.failed else "")


def expand(patterns: list[str]) -> list[str]:
    """Inputs in order: `-`, files, every JSON Lines file under a directory, each glob's matches."""
    out: list[str] = []
    for pattern in patterns:
        if pattern == "-":
            out.append("-")
        elif Path(pattern).is_dir():
            out += sorted(str(path) for path in Path(pattern).rglob("*") if path.suffix in SUFFIXES and path.is_file())
        elif glob.has_magic(pattern):
            out += sorted(glob.glob(pattern, recursive=True))
        else:
            out.append(pattern)
    return out


def session_of(records: list[str], name: str) -> str | None:
    """The session id the records name (sessionId, session_id, sessionID), else one from the file name."""
    for line in records[:50]:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        found = _named_session(record)
        if found:
            return found
    stem = re.sub(r"[^A-Za-z0-9._:-]", "_", Path(name).stem)[:128]
    return stem if name != "-" and stem else None


def _named_session(record: Any) -> str | None:
    if not isinstance(record, dict):
        return None
    props = record["properties"] if isinstance(record.get("properties"), dict) else {}
    for value in (record.get("sessionId"), record.get("session_id"), props.get("sessionID")):
        if isinstance(value, str) and SESSION_ID.match(value):
            return value
    return None


def batches(events: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The events cut into batches of at most BATCH events and FRAME_BUDGET encoded bytes, in order."""
    out: list[list[dict[str, Any]]] = [[]]
    size = 0
    for event in events:
        encoded = len(json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode())
        if out[-1] and (len(out[-1]) >= BATCH or size + encoded > FRAME_BUDGET):
            out.append([])
            size = 0
        out[-1].append(event)
        size += encoded
    return [batch for batch in out if batch]


class Progress:
    """One line redrawn in place on a terminal; plain lines per input otherwise."""

    def __init__(self, out: TextIO) -> None:
        self.out, self.tty = out, out.isatty()

    def show(self, name: str, done: int, total: int, totals: Totals) -> None:
        """The progress of one input: events sent of its total, and the run's counts so far."""
        if self.tty:
            width = 24
            filled = width * done // max(total, 1)
            self.out.write(f"\r{name[-40:]} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} events, "
                           f"{totals.records} records, {totals.written} written, {totals.already} already there ")
            self.out.flush()
        elif done == total:
            self.out.write(f"{name}: {total} events sent ({totals.records} records read so far)\n")

    def end(self) -> None:
        if self.tty:
            self.out.write("\n")


async def send(client: Client, session_id: str, events: list[dict[str, Any]], totals: Totals,
               show: Any) -> None:
    """Emit the events in order, creating the session on first use; counts written and already-there events."""
    done = 0
    for batch in batches(events):
        params = {"sessionId": session_id, "events": batch}
        try:
            result = await client.call("event.emitBatch", params, retry=True)
        except NotFound:
            with suppress(Conflict):  # created meanwhile by someone else
                await client.call("session.create", {"sessionId": session_id})
            result = await client.call("event.emitBatch", params, retry=True)
        duplicates = len(result.get("duplicates", []))
        totals.already += duplicates
        totals.written += len(batch) - duplicates
        done += len(batch)
        show(done, len(events))


def read_input(name: str) -> list[str]:
    if name == "-":
        return sys.stdin.read().splitlines()
    return Path(name).read_text(encoding="utf-8", errors="replace").splitlines()


async def ingest(client: Client, names: list[str], args: argparse.Namespace, progress: Progress) -> Totals:
    """Every input converted and sent; an input that cannot be read or sent is named in `failed`."""
    totals = Totals()
    for name in names:
        try:
            lines = read_input(name)
        except OSError as exc:
            totals.failed.append(f"{name}: {exc.strerror or exc}")
            continue
        session_id = args.session or session_of(lines, name)
        if session_id is None:
            totals.failed.append(f"{name}: no session id (pass --session)")
            continue
        conversion = convert_lines(lines, args.format, args.project_root)
        stats = conversion.stats
        totals.inputs += 1
        totals.records += stats.records
        totals.capped += stats.capped
        totals.skipped.update(stats.skipped)
        await send(client, session_id, conversion.events, totals,
                   lambda done, total, name=name: progress.show(name, done, total, totals))
        if not conversion.events:
            progress.show(name, 0, 0, totals)
    progress.end()
    return totals


def daemon_url(args: argparse.Namespace, settings: Settings) -> str | None:
    """--url, MEMENTO_URL, else the local daemon of the data dir (its runtime.json names the port)."""
    url = args.url or os.environ.get("MEMENTO_URL")
    if url:
        return str(url)
    try:
        port = json.loads((settings.data_dir / "runtime.json").read_text())["port"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return f"ws://127.0.0.1:{port}/ws"


def ingest_command(args: argparse.Namespace, settings: Settings) -> int:
    """The command: 0 when every input was read and sent (skipped records do not fail it), 1 otherwise."""
    url = daemon_url(args, settings)
    if not settings.token or not url:
        missing = "MEMENTO_TOKEN" if not settings.token else f"--url or a daemon running on {settings.data_dir}"
        print(f"memento-sessions ingest: no {missing}", file=sys.stderr)
        return 2
    names = expand(args.files)

    async def run() -> Totals:
        async with Client(url, str(settings.token), reconnect=True, request_timeout=60.0) as client:
            return await ingest(client, names, args, Progress(sys.stderr))

    totals = anyio.run(run)
    print(totals.line())
    return 1 if totals.failed else 0
