"""The agent's git state for fresh handoffs: its HEAD and a digest of its dirty tree, stamped on hook inputs.

The hook (cli_hook.py) calls `stamp` on each input before spooling it: at SessionStart and Stop it runs
`git rev-parse HEAD`, `git status --porcelain=v1 -z` and `git diff HEAD` at once in the project directory,
hashing the last two as they stream (so a large diff costs no memory), and keeps `{head, dirtyDigest}` in the
input (`memento_git`; the digest is the SHA-256 of the two outputs' SHA-256s). All of it is bounded by
MEMENTO_HOOK_GIT_TIMEOUT (seconds, default 0.5; 0 turns it off): past it, outside a git work tree, or without
a commit yet, nothing is stamped.
At delivery `git_events` turns the stamp into a `git:state` event of the session, which `bridge.handoff`
reads back (bridge/freshness.py). Untracked files count by name (status), not by content.

Like the rest of the hook it imports nothing at load time beyond `os` and `time`: `subprocess`, `select` and
`hashlib` are imported only when a stamp is taken, so an edit's hook pays nothing for this module.
"""

from __future__ import annotations

import os
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

STAMPED = ("SessionStart", "Stop")  # the hook events whose input gets the agent's git state
FIELD = "memento_git"  # the key of the stamp in a spooled input
EVENT_TYPE = "git:state"
DEFAULT_TIMEOUT = 0.5
CHUNK = 65536
KEPT = 65536  # bytes of a command's output kept whole (HEAD, a commit's message and files)
COMMIT_FIELD = "memento_git_commit"  # the key of a commit's stamp in a PostToolUse input of Bash
COMMIT_TYPE = "commit"
MESSAGE_MAX = 4096  # characters of a commit message recorded
FILES_MAX = 256  # files of a commit recorded (filesOmitted: how many more)


def stamp(record: dict[str, Any]) -> None:
    """Add the git state of the input's project directory to a SessionStart or Stop input, and the commit a
    Bash `git commit` made to its PostToolUse input (in place)."""
    name = record.get("hook_event_name")
    sha = made_commit(record) if name == "PostToolUse" else None
    if (name not in STAMPED and sha is None) or FIELD in record or COMMIT_FIELD in record:
        return
    timeout = _timeout()
    root = record.get("cwd") if sha is not None else os.environ.get("CLAUDE_PROJECT_DIR") or record.get("cwd")
    if timeout <= 0 or not isinstance(root, str) or not os.path.isdir(root):
        return
    found = state(root, timeout) if sha is None else commit(root, sha, timeout)
    if found is not None:
        record[FIELD if sha is None else COMMIT_FIELD] = found


def made_commit(record: dict[str, Any]) -> str | None:
    """The (short) SHA a successful Bash `git commit` printed (`[main 1a2b3c4] message`), if the input is one."""
    tool_input, response = record.get("tool_input"), record.get("tool_response")
    command = tool_input.get("command") if isinstance(tool_input, dict) else None
    stdout = response.get("stdout") if isinstance(response, dict) else None
    if record.get("tool_name") != "Bash" or not isinstance(command, str) or "commit" not in command \
            or "git" not in command or not isinstance(stdout, str):
        return None
    import re

    found = re.search(r"^\[[^\]\n]* ([0-9a-f]{7,64})\] ", stdout, re.MULTILINE)
    return found.group(1) if found else None


def commit(root: str, sha: str, timeout: float) -> dict[str, Any] | None:
    """`{sha, message, files, filesOmitted?}` of the commit `sha` names in the work tree at `root`."""
    commands = (["show", "-s", "--format=%H%x00%B", sha, "--"],
                ["diff-tree", "--no-commit-id", "--name-only", "-r", "-z", "--root", sha, "--"])
    outputs = run_all(root, commands, time.monotonic() + timeout, keep=(0, 1))
    if outputs is None:
        return None
    full, _, message = outputs[0].decode("utf-8", "replace").partition("\0")
    files = [name for name in outputs[1].decode("utf-8", "replace").split("\0") if name]
    found: dict[str, Any] = {"sha": full.strip(), "message": message.strip()[:MESSAGE_MAX], "files": files[:FILES_MAX]}
    if len(files) > FILES_MAX:
        found["filesOmitted"] = len(files) - FILES_MAX
    return found if len(found["sha"]) in (40, 64) else None


def _timeout() -> float:
    try:
        return max(0.0, float(os.environ.get("MEMENTO_HOOK_GIT_TIMEOUT") or DEFAULT_TIMEOUT))
    except ValueError:
        return DEFAULT_TIMEOUT


def state(root: str, timeout: float) -> dict[str, str] | None:
    """`{head, dirtyDigest}` of the work tree at `root`; None outside one, without a commit, or past `timeout`."""
    import hashlib

    commands = (["rev-parse", "--verify", "-q", "HEAD"], ["status", "--porcelain=v1", "-z"],
                ["diff", "--no-ext-diff", "--no-color", "--binary", "HEAD"])
    outputs = run_all(root, commands, time.monotonic() + timeout, keep=(0,))
    if outputs is None:
        return None
    head = outputs[0].decode("ascii", "replace").strip()
    digest = hashlib.sha256(outputs[1] + outputs[2]).hexdigest()
    return {"head": head, "dirtyDigest": digest} if len(head) in (40, 64) else None


def run_all(root: str, commands: tuple[list[str], ...], deadline: float, keep: tuple[int, ...]) -> list[bytes] | None:
    """Run git `commands` at once in `root` until `deadline`: the outputs of the commands in `keep` (their first
    KEPT bytes), each other's SHA-256 digest (read as it streams); None when one fails or the deadline passes
    (all are then killed)."""
    import subprocess

    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"}  # a read never takes the index lock
    procs = [subprocess.Popen(["git", "-C", root, *command], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              stdin=subprocess.DEVNULL, env=env) for command in commands]
    try:
        outputs = pump(procs, deadline, keep)
        if outputs is None or any(proc.wait(max(0.0, deadline - time.monotonic())) != 0 for proc in procs):
            return None
        return outputs
    except subprocess.TimeoutExpired:
        return None
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


def pump(procs: list[Any], deadline: float, keep: tuple[int, ...]) -> list[bytes] | None:
    """Read every process's output to its end (None when the deadline comes first)."""
    import hashlib
    import select

    kept, hashes = [bytearray() for _ in procs], [hashlib.sha256() for _ in procs]
    streams = {proc.stdout.fileno(): i for i, proc in enumerate(procs)}
    while streams:
        left = deadline - time.monotonic()
        ready = select.select(list(streams), [], [], left)[0] if left > 0 else []
        if not ready:
            return None
        for fd in ready:
            chunk = os.read(fd, CHUNK)
            if not chunk:
                del streams[fd]
            elif streams[fd] in keep:
                kept[streams[fd]] += chunk[:KEPT - len(kept[streams[fd]])]
            else:
                hashes[streams[fd]].update(chunk)
    return [bytes(kept[i]) if i in keep else hashes[i].digest() for i in range(len(procs))]


def git_events(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The `git:state` or `commit` event of a spooled input that carries a stamp (none otherwise)."""
    record, at = entry.get("input"), entry.get("at")
    if not isinstance(record, dict) or not isinstance(at, str):
        return []
    found, made = record.get(FIELD), record.get(COMMIT_FIELD)
    if isinstance(made, dict) and isinstance(made.get("sha"), str):  # once per session whoever reports it
        return [{"id": f"git:commit:{made['sha']}", "type": COMMIT_TYPE, "timestamp": at, "data": made}]
    if not isinstance(found, dict):
        return []
    name = record.get("hook_event_name")
    data = {"head": found.get("head"), "dirtyDigest": found.get("dirtyDigest"), "hook": name}
    return [{"id": f"git:{name}:{at}", "type": EVENT_TYPE, "timestamp": at, "data": data}]
