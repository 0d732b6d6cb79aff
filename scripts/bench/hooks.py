"""Hooks that answer: the lease decision of a PreToolUse, over http and as a command, and the freshness stamp.

- hook-http: `POST /hooks/claude-code` of a PreToolUse on an Edit of a file another agent (another Claude Code
  session) holds a lease on, `warn` and `enforce`, p99 over one keep-alive connection (http.client), beside the
  floor: the daemon's own `/healthz` (a constant answer, the closest one the daemon has) on the same connection.
- hook-decision: `memento-sessions hook` as Claude Code runs it, one process per input, for that PreToolUse
  (answered: the warning is printed), process start to exit, beside the bare interpreter (`python -c pass` in
  the same venv); the two take turns.
- hook-stamp: the SessionStart hook's process on a generated 10,000-file git work tree (one file changed),
  with the freshness stamp on beside off (MEMENTO_HOOK_GIT_TIMEOUT=0): the median difference is what the stamp
  adds to a hook call (the child it spawns takes the git state after the hook returns).
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from bench.harness import Env, Figure, Target, pct

SCRIPT = Path(sys.executable).with_name("memento-sessions")


def edit(sid: str, root: str, n: int, event: str = "PreToolUse") -> dict[str, Any]:
    return {"session_id": sid, "hook_event_name": event, "cwd": root, "transcript_path": "/t", "tool_name": "Edit",
            "tool_use_id": f"toolu_{sid}_{n}", "tool_input": {"file_path": f"{root}/src/auth.py"}}


def posts(port: int, token: str, count: int, policy: str, root: str) -> tuple[list[float], list[float], str]:
    """Wall seconds of `count` PreToolUse POSTs of agent B (policy `policy`) and of as many /healthz, taking
    turns on one keep-alive connection each; and B's last answer."""
    hook, health = http.client.HTTPConnection("127.0.0.1", port), http.client.HTTPConnection("127.0.0.1", port)
    headers = {"authorization": f"Bearer {token}", "content-type": "application/json",
               "x-memento-hook-leases": policy}
    ours, floor, said = [], [], ""
    for n in range(count):
        body = json.dumps(edit(f"bench-b-{policy}", root, n))
        start = time.perf_counter()
        hook.request("POST", "/hooks/claude-code", body, headers)
        said = hook.getresponse().read().decode()
        ours.append(time.perf_counter() - start)
        start = time.perf_counter()
        health.request("GET", "/healthz")
        health.getresponse().read()
        floor.append(time.perf_counter() - start)
    hook.close()
    health.close()
    return ours, floor, said


def claim(port: int, token: str, root: str) -> None:
    """Agent A (session bench-a) edits the file: it claims the lease."""
    connection = http.client.HTTPConnection("127.0.0.1", port)
    connection.request("POST", "/hooks/claude-code", json.dumps(edit("bench-a", root, 0)),
                       {"authorization": f"Bearer {token}", "content-type": "application/json"})
    connection.getresponse().read()
    connection.close()


async def http_decision(env: Env) -> list[Figure]:
    """p99 of the http hook's lease decision (warn, enforce) beside /healthz on the same server."""
    count, root, token = (200 if env.quick else 1000), "/bench-repo", env.token("claude")
    await anyio.to_thread.run_sync(claim, env.port, token, root)
    figures = []
    for policy in ("warn", "enforce"):
        ours, floor, said = await anyio.to_thread.run_sync(posts, env.port, token, count, policy, root)
        if "claude:bencha" not in said:
            raise RuntimeError(f"the {policy} answer does not name the holder: {said}")
        figures.append(Figure(f"http hook: PreToolUse Edit of a leased file ({policy})", "ms p99",
                              pct(ours, 0.99) * 1000, pct(floor, 0.99) * 1000,
                              Target.ratio_under(3, "the daemon's /healthz, same connection kind"),
                              higher_is_better=False,
                              extra={"p50_ms": pct(ours, 0.5) * 1000, "floor_p50_ms": pct(floor, 0.5) * 1000}))
    return figures


def processes(runs: dict[str, tuple[list[str], dict[str, str], list[bytes]]]) -> dict[str, list[float]]:
    """Wall seconds of one process per input, the runs taking turns (a load weighs on all alike)."""
    out: dict[str, list[float]] = {name: [] for name in runs}
    for turn in range(max(len(inputs) for _, _, inputs in runs.values())):
        for name, (command, env, inputs) in runs.items():
            start = time.perf_counter()
            done = subprocess.run(command, input=inputs[turn], env=env, capture_output=True, check=False)
            out[name].append(time.perf_counter() - start)
            if done.returncode != 0 or done.stderr:
                raise RuntimeError(f"{command} exited {done.returncode}: {done.stderr!r}")
    return out


def base_env() -> dict[str, str]:
    """The bench's environment without what would change the hook's cost (see ingest.hook)."""
    return {key: value for key, value in os.environ.items() if key not in ("MEMENTO_URL", "PYTHONDONTWRITEBYTECODE")}


async def command_decision(env: Env) -> Figure:
    """p99 of the command hook answering a PreToolUse (the warning printed), end to end, beside `python -c pass`."""
    count, root = (40 if env.quick else 200), "/bench-repo"
    with tempfile.TemporaryDirectory() as tmp:
        hook_env = {**base_env(), "MEMENTO_DATA_DIR": tmp, "MEMENTO_TOKEN": env.token("claude"),
                    "MEMENTO_URL": f"ws://127.0.0.1:{env.port}/ws", "CLAUDE_PROJECT_DIR": root,
                    "MEMENTO_HOOK_LEASES": "warn"}
        command = [str(SCRIPT), "hook"]
        await anyio.to_thread.run_sync(claim, env.port, env.token("claude"), root)
        inputs = [json.dumps(edit("bench-cmd-b", root, n)).encode() for n in range(count + 1)]
        said = await anyio.to_thread.run_sync(
            lambda: subprocess.run(command, input=inputs[0], env=hook_env, capture_output=True, check=True).stdout)
        if b"claude:bencha" not in said:
            raise RuntimeError(f"the command hook's answer does not name the holder: {said!r}")
        timed = await anyio.to_thread.run_sync(processes, {
            "bare": ([sys.executable, "-c", "pass"], base_env(), [b""] * count),
            "hook": (command, hook_env, inputs[1:])})
    ours, floor = timed["hook"], timed["bare"]
    return Figure("command hook: PreToolUse answered, process start to exit", "ms p99", pct(ours, 0.99) * 1000,
                  pct(floor, 0.99) * 1000, Target.ratio_under(2, "python -c pass, same venv"),
                  higher_is_better=False,
                  extra={"p50_ms": pct(ours, 0.5) * 1000, "floor_p50_ms": pct(floor, 0.5) * 1000})


def work_tree(path: Path, files: int) -> None:
    path.mkdir()
    for n in range(files):
        folder = path / f"d{n // 100}"
        folder.mkdir(exist_ok=True)
        (folder / f"f{n}.py").write_text(f"x = {n}\n")
    git = ["git", "-C", str(path), "-c", "user.email=b@b", "-c", "user.name=b"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "files"], check=True)
    (path / "d0" / "f0.py").write_text("changed\n")


async def stamp(env: Env) -> Figure:
    """What the freshness stamp adds to a SessionStart hook call on a 10,000-file work tree (median of the
    difference of the hook with the stamp on and off, taking turns)."""
    count = 20 if env.quick else 60
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp, "repo")
        await anyio.to_thread.run_sync(work_tree, repo, 10_000)
        common = {**base_env(), "MEMENTO_TOKEN": env.token("claude"), "MEMENTO_URL": f"ws://127.0.0.1:{env.port}/ws",
                  "CLAUDE_PROJECT_DIR": str(repo)}
        on, off = {**common, "MEMENTO_DATA_DIR": f"{tmp}/on"}, {**common, "MEMENTO_DATA_DIR": f"{tmp}/off",
                                                               "MEMENTO_HOOK_GIT_TIMEOUT": "0"}
        command = [str(SCRIPT), "hook"]

        def start(sid: str) -> list[bytes]:
            return [json.dumps({"session_id": f"{sid}-{n}", "hook_event_name": "SessionStart", "cwd": str(repo),
                                "source": "startup"}).encode() for n in range(count)]

        timed = await anyio.to_thread.run_sync(processes, {"on": (command, on, start("bench-stamp-on")),
                                                           "off": (command, off, start("bench-stamp-off"))})
        await anyio.to_thread.run_sync(lambda: subprocess.run([*command, "--flush"], env=on, capture_output=True))
    added = sorted(a - b for a, b in zip(timed["on"], timed["off"], strict=True))
    return Figure("freshness stamp: added to a SessionStart hook call, 10,000-file work tree", "ms median",
                  pct(added, 0.5) * 1000, None, Target.under(20, "ms"), higher_is_better=False,
                  extra={"on_p50_ms": pct(timed["on"], 0.5) * 1000, "off_p50_ms": pct(timed["off"], 0.5) * 1000,
                         "on_p99_ms": pct(timed["on"], 0.99) * 1000, "off_p99_ms": pct(timed["off"], 0.99) * 1000})
