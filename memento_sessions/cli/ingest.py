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
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from itertools import chain, islice
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, TextIO

import pydantic_core

from memento_sessions.cli.pipeline import Pipeline
from memento_sessions.cli.wire import RpcFailure, WireError
from memento_sessions.cli.wire import daemon_url as find_daemon
from memento_sessions.errors import MAX_FRAME, Conflict
from memento_sessions.ingest import FORMATS, LineReader

if TYPE_CHECKING:
    from memento_sessions.settings import Settings

BATCH = 500  # events per event.emitBatch (the method's maximum)
WINDOW = 4  # batches in flight: the next ones are converted while the daemon stores the previous
CHUNK = 1 << 20  # bytes of an input read at a time
TIMEOUT = 60.0  # seconds for a reply, or to regain a lost connection
FRAME_BUDGET = MAX_FRAME - 64 * 1024  # bytes of one batch's events: room for the request around them
SUFFIXES = (".jsonl", ".ndjson", ".json")
SESSION_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}\Z")  # \Z: `$` would also pass a trailing newline
EPILOG = """\
The daemon: --url, else the daemon running on the data dir (its runtime.json), else MEMENTO_URL, else
MEMENTO_HOST / MEMENTO_PORT (the rule of every command).
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
    ingest.add_argument("--url", help="the daemon's WebSocket URL (default: the daemon running on the data "
                        "dir, else MEMENTO_URL, else MEMENTO_HOST/MEMENTO_PORT)")
    ingest.add_argument("--data-dir", help="the running daemon's data dir (MEMENTO_DATA_DIR, default ./.memento)")
    ingest.set_defaults(func=ingest_command)


def _session_id(value: str) -> str:
    if not SESSION_ID.match(value):
        raise argparse.ArgumentTypeError("a session id is 1..128 chars of [A-Za-z0-9._:-]")
    return value


class Totals:
    """What the run did, over every input (a plain class: importing dataclasses, and inspect with it, costs
    the command's start more than the rest of its own modules)."""

    def __init__(self, written: int = 0, already: int = 0) -> None:
        self.inputs = self.records = self.capped = 0
        self.written = written
        self.already = already  # events the session held already (a re-ingest)
        self.skipped: Counter[str] = Counter()
        self.failed: list[str] = []

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


def session_of(records: list[bytes], name: str) -> str | None:
    """The session id the records name (sessionId, session_id, sessionID), else one from the file name."""
    for line in records[:50]:
        try:
            record = json.loads(line.decode("utf-8", "replace"))
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


def batches(events: Iterable[bytes]) -> Iterator[list[bytes]]:
    """The encoded events cut into batches of at most BATCH events and FRAME_BUDGET bytes, in order."""
    batch: list[bytes] = []
    size = 0
    for event in events:
        if batch and (len(batch) >= BATCH or size + len(event) + 1 > FRAME_BUDGET):
            yield batch
            batch, size = [], 0
        batch.append(event)
        size += len(event) + 1  # and the comma that joins it
    if batch:
        yield batch


def parse_fast(line: str | bytes) -> tuple[bool, Any]:
    """A line of JSON parsed by pydantic-core (twice the standard library's speed); bytes must be UTF-8."""
    try:
        return True, pydantic_core.from_json(line)
    except ValueError:
        return False, None


def encode_fast(value: Any) -> bytes:
    """Compact JSON by pydantic-core (three times the standard library's speed); NaN and Infinity come out as
    such, which the converters' check looks for in the text."""
    return pydantic_core.to_json(value)


class Progress:
    """One line redrawn in place on a terminal; plain lines per input otherwise."""

    def __init__(self, out: TextIO, files: int) -> None:
        self.out, self.tty, self.files, self.index = out, out.isatty(), files, 0

    def show(self, name: str, sent: int, *, totals: Totals) -> None:
        """On a terminal: the inputs done of all (as a bar), this one's events sent, the run's counts so far."""
        if self.tty:
            width = 20
            filled = width * self.index // max(self.files, 1)
            self.out.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {self.index}/{self.files} inputs  "
                           f"{name[-32:]}: {sent} events sent; {totals.written} written, {totals.already} already "
                           "there ")
            self.out.flush()

    def done(self, name: str, sent: int, totals: Totals) -> None:
        """One input finished: the bar moves on, or one plain line when not on a terminal."""
        self.index += 1
        if self.tty:
            self.show(name, sent, totals=totals)
        else:
            self.out.write(f"{name}: {sent} events sent ({totals.records} records read so far)\n")

    def end(self) -> None:
        if self.tty:
            self.out.write("\n")


class Sender:
    """One input's batches into one session, WINDOW requests in flight on the one connection.

    The daemon answers a connection's requests one after the other, in the order they were sent, so the
    events are stored in source order while the next batches are converted and encoded here.
    """

    def __init__(self, pipe: Pipeline, session_id: str, totals: Totals, show: Callable[[int], None]) -> None:
        self.pipe, self.session_id, self.totals, self.show = pipe, session_id, totals, show
        self.in_flight: dict[int, int] = {}  # request id -> events in its batch
        self.sent = 0

    def run(self, batches: Iterator[list[bytes]]) -> None:
        """Send every batch pipelined, once the session exists (an input without events creates none).

        The session is created up front rather than on a first batch's NotFound: a refused batch of 500
        events costs the daemon nearly what storing it does, and a first batch sent alone left the daemon
        idle while this process converted the second.
        """
        first = next(batches, None)
        if first is None:
            return
        self.create()
        head = b'{"sessionId":%b,"events":[' % json.dumps(self.session_id).encode()
        for batch in chain([first], batches):
            if len(self.in_flight) >= WINDOW:
                self.settle()
            self.in_flight[self.pipe.send("event.emitBatch", head + b",".join(batch) + b"]}")] = len(batch)
        while self.in_flight:
            self.settle()

    def create(self) -> None:
        """The session, unless it exists (a re-ingest, an earlier input, someone else); a full namespace fails
        the input."""
        try:
            self.pipe.call("session.create", {"sessionId": self.session_id})
        except RpcFailure as exc:
            if exc.code != Conflict.code or (isinstance(exc.data, dict) and exc.data.get("reason")):
                raise  # a bound (namespace_full), not "exists"

    def settle(self) -> None:
        """The next batch's reply counted; a refused batch (session full, invalid) is named in the summary and
        the rest goes on."""
        request_id, result = self.pipe.reply()
        count = self.in_flight.pop(request_id)
        if isinstance(result, RpcFailure):
            self.totals.failed.append(f"{self.session_id}: {count} events refused: {result}")
            return
        duplicates = len(result.get("duplicates", []))
        self.totals.already += duplicates
        self.totals.written += count - duplicates
        self.sent += count
        self.show(self.sent)


def read_input(name: str) -> Iterator[bytes]:
    """The input's lines as bytes, cut at newlines only: JSON text may hold a raw U+2028 or NEL, where
    str.splitlines would cut a record in two; parsing bytes also spares decoding them first. Read a chunk
    at a time, so the daemon stores the first batches while the rest is read; OSError at once when the
    file cannot be opened."""
    return _lines(sys.stdin.buffer) if name == "-" else _lines(open(name, "rb"), close=True)


def _lines(stream: BinaryIO, close: bool = False) -> Iterator[bytes]:
    try:
        rest = b""
        while chunk := stream.read(CHUNK):
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop()  # the start of a line the next chunk ends
            yield from lines
        yield rest
    finally:
        if close:
            stream.close()


def ingest(pipe: Pipeline, names: list[str], args: argparse.Namespace, progress: Progress) -> Totals:
    """Every input converted and sent; an input that cannot be read or sent is named in `failed`."""
    totals = Totals()
    for name in names:
        try:
            lines = read_input(name)
            head = list(islice(lines, 50))  # where the session id is looked for
        except OSError as exc:
            totals.failed.append(f"{name}: {exc.strerror or exc}")
            continue
        session_id = args.session or session_of(head, name)
        if session_id is None:
            totals.failed.append(f"{name}: no session id (pass --session)")
            continue
        reader = LineReader(args.format, args.project_root, parse_fast, encode_fast)
        sender = Sender(pipe, session_id, totals, partial(progress.show, name, totals=totals))
        try:
            sender.run(batches(event for line in chain(head, lines) for event in reader.feed_encoded(line)))
        except (RpcFailure, WireError) as exc:
            totals.failed.append(f"{name}: {exc}")
        except OSError as exc:  # the input failed part way
            totals.failed.append(f"{name}: {exc.strerror or exc}")
        stats = reader.finish()
        totals.inputs += 1
        totals.records += stats.records
        totals.capped += stats.capped
        totals.skipped.update(stats.skipped)
        progress.done(name, sender.sent, totals)
    progress.end()
    return totals


def daemon_url(args: argparse.Namespace, data_dir: Path, host: str | None, port: str | int | None) -> str:
    """--url, else every command's rule (cli/wire.py\'s daemon_url): the data dir's runtime.json, else MEMENTO_URL,
    else MEMENTO_HOST / MEMENTO_PORT."""
    return args.url or find_daemon(str(data_dir), os.environ.get("MEMENTO_URL"), host, port)


def ingest_command(args: argparse.Namespace, settings: Settings) -> int:
    """The command: 0 when every input was read and sent (skipped records do not fail it), 1 otherwise."""
    return run(args, settings.token, settings.data_dir, (settings.host, settings.port))


def quick_main(argv: list[str]) -> int | None:
    """The command without loading the settings, when the environment and the arguments name all it needs.

    Importing pydantic-settings costs about 0.3 s of CPU, as much as converting 6,000 records. The
    environment takes precedence over .env in the settings too, so with MEMENTO_TOKEN set and the daemon
    named (--url, MEMENTO_URL) or its data dir (--data-dir, MEMENTO_DATA_DIR) the outcome is the same.
    None: something may come from .env, take the usual path.
    """
    parser = argparse.ArgumentParser(prog="memento-sessions")
    register(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    args = parser.parse_args(["ingest", *argv])
    token = os.environ.get("MEMENTO_TOKEN")
    data_dir = args.data_dir or os.environ.get("MEMENTO_DATA_DIR")
    if not token or not (args.url or os.environ.get("MEMENTO_URL") or data_dir):
        return None
    where = (os.environ.get("MEMENTO_HOST"), os.environ.get("MEMENTO_PORT"))
    return run(args, token, Path(data_dir or ".memento"), where)


def run(args: argparse.Namespace, token: str | None, data_dir: Path, where: tuple[str | None, str | int | None],
        ) -> int:
    """Every input sent with this token to the daemon (--url, else every command's rule); the summary."""
    url = daemon_url(args, data_dir, *where)
    if not token:
        print("memento-sessions ingest: no MEMENTO_TOKEN", file=sys.stderr)
        return 2
    names = expand(args.files)
    try:
        pipe = Pipeline(url, token, TIMEOUT)
    except WireError as exc:
        print(f"memento-sessions ingest: cannot connect to {url}: {exc}", file=sys.stderr)
        return 1
    try:
        totals = ingest(pipe, names, args, Progress(sys.stderr, len(names)))
    finally:
        pipe.close()
    print(totals.line())
    return 1 if totals.failed else 0
