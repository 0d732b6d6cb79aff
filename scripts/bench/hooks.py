"""Hooks that answer: the lease decision of a PreToolUse, over http and as a command, and the freshness stamp.

- hook-http: `POST /hooks/claude-code` of a PreToolUse on an Edit of a file another agent (another Claude Code
  session) holds a lease on, `warn` and `enforce`, p99 over one keep-alive connection (http.client), beside the
  floor: the daemon's own `/healthz` (a constant answer, the closest one the daemon has) on the same connection.
- hook-decision: `memento-sessions hook` as Claude Code runs it, one process per input, for that PreToolUse
  (answered: the warning is printed), process start to exit, beside the bare interpreter (`python -c pass` in
  the same venv); the two take turns.
- hook-stamp: the SessionStart hook's process on a generated 10,000-file git work tree (one file changed),
  with the freshness stamp on beside off (MEMENTO_HOOK_GIT_TIMEOUT=0): the difference of the medians is what the
  stamp adds to a hook call (the child it spawns takes the git state after the hook returns and delivers it);
  every session's git:state must be stored in the end.
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

from bench.harness import Env, Figure, Target, pct, stored_events

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
    """What the freshness stamp adds to a SessionStart hook call on a 10,000-file work tree: the median with the
    stamp on less the median with it off (the two taking turns); every stamp must be stored in the end."""
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
    stamped = 0
    for n in range(count):
        stored = await stored_events(env, f"bench-stamp-on-{n}")
        stamped += any(event["type"] == "git:state" for event in stored)
    if stamped != count:
        raise RuntimeError(f"{count - stamped} of {count} SessionStart hooks have no git:state stored")
    added = pct(timed["on"], 0.5) - pct(timed["off"], 0.5)
    return Figure("freshness stamp: added to a SessionStart hook call, 10,000-file work tree", "ms p50 on - off",
                  added * 1000, None, Target.under(20, "ms"), higher_is_better=False,
                  extra={"stamped": stamped, "on_p50_ms": pct(timed["on"], 0.5) * 1000,
                         "off_p50_ms": pct(timed["off"], 0.5) * 1000,
                         "on_p99_ms": pct(timed["on"], 0.99) * 1000, "off_p99_ms": pct(timed["off"], 0.99) * 1000})


LOOP_AGENTS = 20
INTERVAL = 2.0  # seconds between one agent's tool calls


async def post_hook(port: int, token: str, record: dict[str, Any]) -> dict[str, Any]:
    """One POST /hooks/claude-code over a fresh connection (as Claude Code's http hook); the answer."""
    body = json.dumps(record).encode()
    head = (f"POST /hooks/claude-code HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        await stream.send(head.encode() + body)
        reply = b""
        try:
            while True:
                reply += await stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            pass
    answer: dict[str, Any] = json.loads(reply.partition(b"\r\n\r\n")[2] or b"{}")
    return answer


async def agent_loop(env: Env) -> list[Figure]:  # noqa: C901 - one scenario: its two roles read inline
    """20 agents (Claude Code sessions of one token) each make a tool call every 2 s through the http hook
    (PostToolUse), while messages go between them at random (mailbox.send as the sending session's agent).
    Every message must surface in its recipient's context at its next tool call: the figure is the p99 of
    send -> surfaced, the target one tool-call interval, with none missed and none surfaced twice."""
    seconds = 20.0 if env.quick else 60.0
    token, port = env.token("claude"), env.port
    sids = [f"agent{n:03d}" for n in range(LOOP_AGENTS)]
    sent: dict[str, float] = {}
    surfaced: dict[str, list[float]] = {}
    calls = [0]

    async def agent(n: int, end: float) -> None:
        sid = sids[n]
        due = time.perf_counter() + INTERVAL * n / LOOP_AGENTS  # spread over the interval
        call = 0
        while True:
            await anyio.sleep(max(0.0, due - time.perf_counter()))  # one call every INTERVAL, start to start
            due += INTERVAL
            call += 1
            record = {"session_id": sid, "hook_event_name": "PostToolUse", "cwd": "/loop", "tool_name": "Read",
                      "tool_use_id": f"toolu_{sid}_{call}", "transcript_path": "/t",
                      "tool_input": {"file_path": "/loop/a.py"}, "tool_response": {"ok": True}}
            answer = await post_hook(port, token, record)
            now = time.perf_counter()
            calls[0] += 1
            context = str(answer.get("hookSpecificOutput", {}).get("additionalContext", ""))
            for marker in [word for word in context.replace(".", " ").split() if word.startswith("msg-")]:
                surfaced.setdefault(marker, []).append(now)
            if now >= end:
                return

    async def sender(end: float) -> None:
        import random

        from websockets.asyncio.client import connect

        rng, count = random.Random(7), 0
        connections = {}
        for sid in sids:
            url = f"ws://127.0.0.1:{port}/ws?token={token}&session={sid}"
            connections[sid] = await connect(url, max_size=2**24, compression=None).__aenter__()
        try:
            while time.perf_counter() < end - 2 * INTERVAL:  # the last ones still have a call to surface at
                source, target = rng.sample(sids, 2)
                count += 1
                marker = f"msg-{count}"
                ws = connections[source]
                await ws.send(json.dumps({"jsonrpc": "2.0", "id": count, "method": "mailbox.send",
                                          "params": {"to": f"claude:{target}", "body": f"ping {marker} x"}}))
                while True:
                    reply = json.loads(await ws.recv())
                    if reply.get("id") == count:
                        break
                if "error" in reply:
                    raise RuntimeError(f"mailbox.send refused: {reply['error']}")
                sent[marker] = time.perf_counter()
                await anyio.sleep(rng.expovariate(10.0))  # about ten a second
        finally:
            for ws in connections.values():
                await ws.close()

    for sid in sids:  # every agent seen once (a message to an agent never seen is refused)
        await post_hook(port, token, {"session_id": sid, "hook_event_name": "SessionStart", "cwd": "/loop",
                                      "source": "startup", "transcript_path": "/t"})
    end = time.perf_counter() + seconds
    async with anyio.create_task_group() as group:
        for n in range(LOOP_AGENTS):
            group.start_soon(agent, n, end)
        group.start_soon(sender, end)
    latencies = [min(surfaced[m]) - at for m, at in sent.items() if m in surfaced]
    missed = sum(1 for marker in sent if marker not in surfaced)
    twice = sum(1 for marker in sent if len(surfaced.get(marker, ())) > 1)
    figure = Figure(f"agent loop: {LOOP_AGENTS} agents, a tool call every {INTERVAL:g} s, send -> surfaced",
                    "ms p99", pct(latencies, 0.99) * 1000 if latencies else float("inf"), None,
                    Target.below_ms(INTERVAL * 1000), higher_is_better=False,
                    extra={"sent": len(sent), "missed": missed, "surfaced_twice": twice, "tool_calls": calls[0],
                           "p50_ms": pct(latencies, 0.5) * 1000 if latencies else 0.0, "seconds": seconds})
    if missed or twice:
        figure.target = Target.below_ms(0)  # a message missed or doubled fails the target whatever the latency
    return [figure]
