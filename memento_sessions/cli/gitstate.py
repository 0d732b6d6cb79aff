"""The agent's git state for fresh handoffs: its HEAD and a digest of its dirty tree, stamped on hook inputs.

The hook (cli/hook.py) calls `stamp` on each input before spooling it: at SessionStart and Stop it runs
`git rev-parse HEAD`, `git status --porcelain=v1 -z` and `git diff HEAD` at once in the project directory,
hashing the last two as they stream (so a large diff costs no memory), and keeps `{head, dirtyDigest}` in the
input (`memento_git`; the digest is the SHA-256 of the two outputs' SHA-256s). All of it is bounded by
MEMENTO_HOOK_GIT_TIMEOUT (seconds, default 0.5; 0 turns it off): past it, outside a git work tree, or without
a commit yet, nothing is stamped.
At delivery `git_events` turns the stamp into a `git:state` event of the session, which `bridge.handoff`
reads back (bridge/freshness.py). Untracked files count by name (status), not by content.

Like the rest of the hook it imports nothing at load time beyond `os` and `time`: `subprocess`, `select` and
`hashlib` are imported only when a stamp is taken, so an edit's hook pays nothing for this module.

The git state and the uncommitted work (SessionStart, Stop, SessionEnd) take tens of milliseconds on a large
work tree (git status alone), more than a hook call may spend: the hook spawns a detached child instead
(cli/stamp.py: os.posix_spawn of `python -m memento_sessions.cli.stamp`, its own session, stdio on /dev/null,
so Claude Code does not wait for it), which takes them and appends them to the spool as one more line (marked
`memento_git_deferred`, the input's own time, so its events' ids are what the hook would have written); the
next hook call delivers it. Each child holds a shared flock on `<spool>/stamping.lock` (taken by the hook
before the spawn, so none is missed), and `hook --flush` waits for them all before it delivers. Only the
commit stamp of a PostToolUse (a few milliseconds, small outputs) stays in the hook call.

`memento-sessions session suspend` takes the uncommitted work of the tree it runs in the same way (`work`,
`patch_events`: cli/session.py), and `session checkout` reads the newest back (`newest_patch`, `apply`).
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
PATCHED = ("Stop", "SessionEnd")  # the hook events whose input carries the agent's uncommitted work
PATCH_FIELD = "memento_git_patch"
PATCH_TYPE = "git:patch"
PATCH_MAX = 262144  # default MEMENTO_HOOK_PATCH_MAX_BYTES
PATCH_CEILING = 524288  # the most it may be: a patch's events go in one emitBatch, under the 1 MiB frame
PART = 8192  # patch bytes per event (base64: about 11 KiB of data, under the 16 KiB an event's data holds)
DEFERRED = "memento_git_deferred"  # a spool line a detached child wrote: its stamps only, no hook event of its own
LOCK = "stamping.lock"  # in the spool folder: a child stamping holds it shared, `hook --flush` waits exclusive


def stamp(record: dict[str, Any], slow: bool = True) -> None:
    """Add to a hook input (in place) what this module records of it: the git state at SessionStart and Stop,
    the uncommitted work at Stop and SessionEnd (`slow`: else left to `spawn`), the commit a Bash `git commit`
    made at its PostToolUse."""
    name = record.get("hook_event_name")
    sha = made_commit(record) if name == "PostToolUse" else None
    if (name not in STAMPED and name not in PATCHED and sha is None) or FIELD in record or COMMIT_FIELD in record:
        return
    if not slow and sha is None:
        return
    timeout, root = git_timeout(), record.get("cwd") if sha is not None else os.environ.get(
        "CLAUDE_PROJECT_DIR") or record.get("cwd")
    if timeout <= 0 or not isinstance(root, str) or not os.path.isdir(root):
        return
    deadline = time.monotonic() + timeout
    found = {COMMIT_FIELD: commit(root, sha, timeout)} if sha is not None else {}
    if name in STAMPED and slow:
        found[FIELD] = state(root, timeout)
    if name in PATCHED and slow and patch_max() > 0:
        found[PATCH_FIELD] = work(root, max(0.0, deadline - time.monotonic()), patch_max(), clean=True)
    record.update({key: value for key, value in found.items() if value is not None})


def deferred(record: dict[str, Any]) -> bool:
    """Whether the input has slow stamps for a child to take (SessionStart, Stop, SessionEnd with git on)."""
    name = record.get("hook_event_name")
    return (name in STAMPED or (name in PATCHED and patch_max() > 0)) and FIELD not in record and git_timeout() > 0


def patch_max() -> int:
    """MEMENTO_HOOK_PATCH_MAX_BYTES: the largest patch of uncommitted work recorded (0: none), at most PATCH_CEILING."""
    try:
        return min(PATCH_CEILING, max(0, int(os.environ.get("MEMENTO_HOOK_PATCH_MAX_BYTES") or PATCH_MAX)))
    except ValueError:
        return PATCH_MAX


def work(root: str, timeout: float, limit: int, clean: bool = False) -> dict[str, Any] | None:
    """The uncommitted work at `root` as a binary patch against HEAD, untracked files (not ignored) included:
    `{head, bytes, sha256, parts}` (parts: base64 of PART bytes each), or `{head, refused: "too_large", max}`
    past `limit` bytes; None outside a work tree, past `timeout`, or when clean (with `clean`: an empty patch,
    one empty part, so a checkout brings a tree to that HEAD and no older work). A copy of the index takes
    the untracked files (`git add -A` on it), so the agent's own index is untouched."""
    import base64
    import hashlib
    import shutil
    import tempfile

    deadline = time.monotonic() + timeout
    found = run_all(root, (["rev-parse", "--verify", "-q", "HEAD"], ["rev-parse", "--git-path", "index"]),
                    deadline, keep=(0, 1))
    if found is None:
        return None
    head, index = found[0].decode().strip(), os.path.join(root, found[1].decode().strip())
    fd, copy = tempfile.mkstemp(prefix="memento-index-")
    os.close(fd)
    try:
        if os.path.exists(index):
            shutil.copyfile(index, copy)
        extra = {"GIT_INDEX_FILE": copy}
        added = run_all(root, (["add", "-A"],), deadline, keep=(), extra=extra)
        diff = ["diff", "--cached", "--binary", "--no-ext-diff", "--no-color", "HEAD"]
        patch = None if added is None else run_all(root, (diff,), deadline, keep=(0,), extra=extra, kept=limit + 1)
    finally:
        os.unlink(copy)
    if patch is None or not (patch[0] or clean):
        return None
    if len(patch[0]) > limit:
        return {"head": head, "refused": "too_large", "max": limit}
    parts = [base64.b64encode(patch[0][i:i + PART]).decode() for i in range(0, len(patch[0]), PART)] or [""]
    return {"head": head, "bytes": len(patch[0]), "sha256": hashlib.sha256(patch[0]).hexdigest(), "parts": parts}


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


def git_timeout() -> float:
    """MEMENTO_HOOK_GIT_TIMEOUT: the seconds git may take for a stamp (0: none taken)."""
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


def run_all(root: str, commands: tuple[list[str], ...], deadline: float, keep: tuple[int, ...],
            extra: dict[str, str] | None = None, kept: int = KEPT) -> list[bytes] | None:
    """Run git `commands` at once in `root` until `deadline`: the outputs of the commands in `keep` (their first
    KEPT bytes), each other's SHA-256 digest (read as it streams); None when one fails or the deadline passes
    (all are then killed)."""
    import subprocess

    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C", **(extra or {})}  # no index lock for a read
    procs = [subprocess.Popen(["git", "-C", root, *command], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              stdin=subprocess.DEVNULL, env=env) for command in commands]
    try:
        outputs = pump(procs, deadline, keep, kept)
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


def pump(procs: list[Any], deadline: float, keep: tuple[int, ...], limit: int = KEPT) -> list[bytes] | None:
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
                kept[streams[fd]] += chunk[:limit - len(kept[streams[fd]])]
            else:
                hashes[streams[fd]].update(chunk)
    return [bytes(kept[i]) if i in keep else hashes[i].digest() for i in range(len(procs))]


def git_events(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The `commit`, `git:state` and `git:patch` events of a spooled input that carries stamps."""
    record, at = entry.get("input"), entry.get("at")
    if not isinstance(record, dict) or not isinstance(at, str):
        return []
    events: list[dict[str, Any]] = []
    made, found, work_done = record.get(COMMIT_FIELD), record.get(FIELD), record.get(PATCH_FIELD)
    if isinstance(made, dict) and isinstance(made.get("sha"), str):  # once per session whoever reports it
        events.append({"id": f"git:commit:{made['sha']}", "type": COMMIT_TYPE, "timestamp": at, "data": made})
    name = record.get("hook_event_name")
    if isinstance(found, dict):
        data = {"head": found.get("head"), "dirtyDigest": found.get("dirtyDigest"), "hook": name}
        events.append({"id": f"git:{name}:{at}", "type": EVENT_TYPE, "timestamp": at, "data": data})
    if isinstance(work_done, dict):
        events += patch_events(work_done, at)
    return events


def patch_events(work_done: dict[str, Any], at: str) -> list[dict[str, Any]]:
    """One `git:patch` event per part (`{head, bytes, sha256, part, parts, data}`), or one saying it was refused."""
    parts = work_done.get("parts")
    if not isinstance(parts, list):
        return [{"id": f"git:patch:{at}:0", "type": PATCH_TYPE, "timestamp": at, "data": work_done}]
    head = {key: work_done.get(key) for key in ("head", "bytes", "sha256")}
    return [{"id": f"git:patch:{at}:{i}", "type": PATCH_TYPE, "timestamp": at,
             "data": {**head, "part": i, "parts": len(parts), "data": part}} for i, part in enumerate(parts)]


def newest_patch(events: list[dict[str, Any]]) -> tuple[str, bytes] | str:
    """(head, patch) of the newest complete `git:patch` set among a session's events, or why there is none.
    Newest by when it was taken (its ids carry that time): a Stop's patch delivered late does not hide the one
    a later `session suspend` stored. Parts that are not ours (a part that is no number) are passed over."""
    sets: dict[str, dict[int, dict[str, Any]]] = {}
    for event in events:
        data, name = event.get("data"), str(event.get("id", "")).rsplit(":", 1)[0]
        if event.get("type") == PATCH_TYPE and isinstance(data, dict) and name.startswith(f"{PATCH_TYPE}:") \
                and isinstance(data.get("part", 0), int):
            sets.setdefault(name, {})[data.get("part", 0)] = data
    for name in sorted(sets, reverse=True):  # `git:patch:<UTC time>`: the newest first
        parts, first = sets[name], sets[name].get(0) or {}
        if first.get("refused"):
            return f"the uncommitted work was not stored: larger than {first.get('max')} bytes " \
                   "(MEMENTO_HOOK_PATCH_MAX_BYTES)"
        if len(parts) == first.get("parts") and all(i in parts for i in range(len(parts))):
            return patch_of(first, [parts[i].get("data") for i in range(len(parts))])
    return "the session has no stored uncommitted work (the hook stores it at Stop and SessionEnd, " \
           "`session suspend` from a git work tree)"


def patch_of(first: dict[str, Any], chunks: list[Any]) -> tuple[str, bytes] | str:
    """The patch the parts make, if its digest matches and its HEAD is a commit id (never an option for git)."""
    import base64
    import hashlib
    import re

    try:
        patch = b"".join(base64.b64decode(chunk, validate=True) for chunk in chunks)
    except (ValueError, TypeError):  # binascii.Error is a ValueError
        patch = None
    head = first.get("head")
    if patch is None or hashlib.sha256(patch).hexdigest() != first.get("sha256") or not isinstance(head, str) \
            or not re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", head):
        return "the stored uncommitted work is damaged (its digest or its HEAD does not match)"
    return head, patch


def apply(into: str, head: str, patch: bytes) -> str | None:
    """Bring the work tree `into` to `head` (when it is clean) and apply `patch` to it; why not, if it failed."""
    import subprocess

    def git(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(["git", "-C", into, *args], input=stdin, capture_output=True, timeout=120, check=False)

    current = git("rev-parse", "--verify", "-q", "HEAD")
    if current.returncode != 0:
        return f"{into} is not a git work tree with a commit"
    if current.stdout.decode().strip() != head:
        if git("status", "--porcelain").stdout.strip():
            return f"{into} has uncommitted changes and is not at {head}: commit or clean them first"
        moved = git("checkout", "-q", "--detach", head)
        if moved.returncode != 0:
            return f"cannot check out {head} in {into} (fetch it first): {moved.stderr.decode().strip()}"
    if not patch:  # the tree was clean: its HEAD is the work
        return None
    applied = git("apply", "--binary", "--whitespace=nowarn", "-", stdin=patch)
    return None if applied.returncode == 0 else f"the patch does not apply: {applied.stderr.decode().strip()}"

