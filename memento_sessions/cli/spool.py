"""The hook's spool: `<data dir>/hook-spool/spool.jsonl`, the inputs not yet delivered, and its files.

Every input is appended under an exclusive flock; the one hook that holds the delivery lock reads it a
chunk at a time after the delivered offset (`spool.offset`), commits that offset, empties the spool once
all is delivered, and keeps what is not delivered under a cap (MEMENTO_HOOK_SPOOL_MAX_BYTES): past it the
oldest inputs are dropped, counted in `dropped` and said once on stderr. Every file is owner-only (0600).
Standard library only, and little of it (see cli/hook.py: the hook runs once per tool call).
"""

from __future__ import annotations

import fcntl
import os
import sys
import time

from memento_sessions.cli import fastjson

TYPE_CHECKING = False  # not `typing` (mypy takes any name TYPE_CHECKING as true)
if TYPE_CHECKING:
    from types import TracebackType
    from typing import Any

MAX_INPUT = 4 * 1024 * 1024  # a hook input larger than this is not one Claude Code sends
SPOOL_MAX = 32 * 1024 * 1024  # bytes not yet delivered the spool keeps (MEMENTO_HOOK_SPOOL_MAX_BYTES)
SPOOL_MIN = 1024 * 1024  # the least MEMENTO_HOOK_SPOOL_MAX_BYTES may be (a few of the largest inputs)
CHUNK = 256 * 1024  # bytes of the spool read, converted and delivered at a time: memory does not grow with it
MAX_LINE = 2 * MAX_INPUT  # a spooled line longer than this is not one the hook wrote
COPY = 1024 * 1024  # bytes read or moved at a time when the spool is trimmed


def now_iso() -> str:
    """The UTC time to the microsecond, as `2026-01-02T03:04:05.123456Z` (without importing datetime)."""
    now = time.time_ns() // 1000
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now // 1_000_000)) + f".{now % 1_000_000:06d}Z"


class Locked:
    """The file descriptor of `path` opened with `flags`, held under flock `mode` (a class, not a
    contextlib.contextmanager: contextlib is an import the hook can do without)."""

    def __init__(self, path: str, flags: int, mode: int = fcntl.LOCK_EX) -> None:
        self.fd = os.open(path, flags, 0o600)
        try:
            fcntl.flock(self.fd, mode)
        except BaseException:
            os.close(self.fd)
            raise

    def __enter__(self) -> int:
        return self.fd

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        os.close(self.fd)  # closing releases the lock


def spool(record: Any, folder: str, at: str | None = None) -> tuple[str, int, int]:
    """Append one input with when it was read (`at`, else now) and the project root; one write under the
    lock. The time it was spooled with, and where its line starts and ends in the spool."""
    os.makedirs(folder, mode=0o700, exist_ok=True)
    root = os.environ.get("CLAUDE_PROJECT_DIR") or (record.get("cwd") if isinstance(record, dict) else None)
    at = at or now_iso()
    line = fastjson.dumps({"at": at, "root": root, "input": record})
    data = (line + "\n").encode()
    with Locked(os.path.join(folder, "spool.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT) as fd:
        os.write(fd, data)
        end = os.lseek(fd, 0, os.SEEK_CUR)
    return at, end - len(data), end


def read_text(path: str) -> str:
    with open(path, encoding="utf-8") as file:
        return file.read()


def read_offset(folder: str) -> int:
    try:
        return int(read_text(os.path.join(folder, "spool.offset")) or 0)
    except (OSError, ValueError):
        return 0


def write_offset(folder: str, offset: int) -> None:
    """Commit the delivered offset atomically (a crash leaves the old or the new one, never half)."""
    write_file(os.path.join(folder, "spool.offset"), str(offset))


def write_file(path: str, text: str) -> None:
    """Replace the file atomically, owner-only (0600) as everything in the spool."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def pending(folder: str, offset: int, limit: int = CHUNK) -> list[tuple[int, bytes]]:
    """(end offset, line) of the whole lines after `offset`, about `limit` bytes of them (at least one line);
    a torn last line waits. Under the spool's shared lock, held only while reading."""
    out: list[tuple[int, bytes]] = []
    with Locked(os.path.join(folder, "spool.jsonl"), os.O_RDONLY | os.O_CREAT, fcntl.LOCK_SH) as fd, \
            os.fdopen(os.dup(fd), "rb") as spooled:
        spooled.seek(offset)
        read = 0
        while read < limit:
            line = spooled.readline(MAX_LINE)
            if not line.endswith(b"\n") and len(line) < MAX_LINE:
                break  # the end, or a line being written
            offset, read = offset + len(line), read + len(line)
            out.append((offset, line))
    return out


def parse(line: bytes) -> dict[str, Any]:
    try:
        entry = fastjson.loads(line)
    except ValueError:
        return {}
    return entry if isinstance(entry, dict) else {}


def spool_cap() -> int:
    """MEMENTO_HOOK_SPOOL_MAX_BYTES (at least SPOOL_MIN), else SPOOL_MAX."""
    try:
        return max(SPOOL_MIN, int(os.environ.get("MEMENTO_HOOK_SPOOL_MAX_BYTES") or SPOOL_MAX))
    except ValueError:
        return SPOOL_MAX


def trim(folder: str) -> int:
    """Keep the spool's undelivered bytes under its cap: past it, drop the oldest inputs, keeping the newest
    half of the cap; the number dropped. Done in place under the spool's lock (an append waiting for the lock
    lands after the kept lines), by the one hook that holds the delivery lock (the offset is its to move)."""
    cap = spool_cap()
    with Locked(os.path.join(folder, "spool.jsonl"), os.O_RDWR | os.O_CREAT) as fd:
        size, offset = os.fstat(fd).st_size, read_offset(folder)
        if size - offset <= cap:
            return 0
        cut = line_start(fd, size - cap // 2, size)
        dropped = count_lines(fd, offset, cut)
        write_offset(folder, 0)  # first: a crash while moving leaves lines sent twice (written once), none lost
        for start in range(cut, size, COPY):
            os.pwrite(fd, os.pread(fd, min(COPY, size - start), start), start - cut)
        os.ftruncate(fd, size - cut)
    return dropped


def line_start(fd: int, position: int, size: int) -> int:
    """The start of the first whole line at or after `position` (`size` when there is none)."""
    while position < size:
        chunk = os.pread(fd, min(COPY, size - position), position)
        newline = chunk.find(b"\n")
        if newline >= 0:
            return position + newline + 1
        position += len(chunk)
    return size


def count_lines(fd: int, start: int, end: int) -> int:
    return sum(os.pread(fd, min(COPY, end - at), at).count(b"\n") for at in range(start, end, COPY))


def note_dropped(folder: str, dropped: int) -> None:
    """Add to the spool's count of dropped inputs (`dropped`), and say it on stderr, once per trim."""
    if not dropped:
        return
    path = os.path.join(folder, "dropped")
    try:
        total = int(read_text(path) or 0) + dropped
    except (OSError, ValueError):
        total = dropped
    write_file(path, str(total))
    sys.stderr.write(f"memento-sessions hook: more than {spool_cap()} bytes spooled and not delivered: dropped "
                     f"the {dropped} oldest inputs ({total} in all; MEMENTO_HOOK_SPOOL_MAX_BYTES sets the cap)\n")


def compact(folder: str) -> None:
    """Empty the spool once everything in it is delivered (checked under its lock: no append is lost)."""
    with Locked(os.path.join(folder, "spool.jsonl"), os.O_WRONLY | os.O_CREAT) as fd:
        if os.fstat(fd).st_size == read_offset(folder):
            os.ftruncate(fd, 0)
            write_offset(folder, 0)
