"""Ingest: `memento-sessions ingest` end to end, and the Claude Code hook's process wall time.

- ingest: a Claude Code transcript of ~20,000 records (the shipped sample, its ids made unique per copy)
  through the real command as a process (reading, converting, event.emitBatch over the WebSocket, the
  daemon storing), in records/s, with the CPU seconds the ingest process, the daemon and Redis spent
  (less noisy than the wall time on a shared machine). The floor: bare redis-py FCALL ms_emit of the same
  events in the same batches of 500 (their bodies built before the clock starts), per record.
- hook: `memento-sessions hook` as Claude Code runs it, one process per hook input, p99 wall time with
  the daemon up (the input delivered), and with the daemon away (it only spools). The floor of a process
  per hook: the interpreter starting and exiting (`python -c pass`).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from bench.daemons import cpu_seconds
from bench.harness import Env, Figure, Target, new_session, pct
from memento_sessions import keys
from memento_sessions.ingest import convert_lines
from memento_sessions.sessions.manager import emit_args, event_body, iso, now_ms, sends_whole
from memento_sessions.sessions.models import EventIn

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "tests" / "fixtures" / "spotter_tool_heavy.jsonl"
COMMAND = [sys.executable, "-m", "memento_sessions.cli"]
SCRIPT = Path(sys.executable).with_name("memento-sessions")  # what a hook setting runs
BATCH = 500


def transcript(copies: int) -> list[str]:
    """The sample `copies` times, each copy's uuids, tool-use and message ids made its own."""
    lines = SAMPLE.read_text().splitlines()
    out = []
    for copy in range(copies):
        for line in lines:
            out.append(line.replace('"uuid": "', f'"uuid": "c{copy}-').replace('"uuid":"', f'"uuid":"c{copy}-')
                       .replace("toolu_", f"toolu_c{copy}_").replace("msg_", f"msg_c{copy}_"))
    return out


async def ingest(env: Env) -> Figure:
    """Records per second `memento-sessions ingest FILE` takes into the daemon, process start included."""
    lines = transcript(100 if env.quick else 520)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "transcript.jsonl"
        path.write_text("\n".join(lines) + "\n")
        run_env = {**os.environ, "MEMENTO_TOKEN": env.token("importer"), "MEMENTO_URL": f"ws://127.0.0.1:{env.port}/ws"}
        before = await cpu_now(env)
        start = time.perf_counter()
        done = await anyio.run_process([*COMMAND, "ingest", str(path), "--session", "bench-ingest"], env=run_env,
                                       check=False)
        elapsed = time.perf_counter() - start
        cpu = {name: round(after - before[name], 3) for name, after in (await cpu_now(env)).items()}
    if done.returncode != 0:
        raise RuntimeError(f"ingest failed: {done.stdout.decode()} {done.stderr.decode()}")
    events = convert_lines(lines).events
    if f"{len(events)} events written" not in done.stdout.decode():
        raise RuntimeError(f"ingest wrote other than {len(events)} events: {done.stdout.decode()}")
    floor = len(lines) / await bare_batches(env, events)
    return Figure(f"ingest, {len(lines):,} transcript records ({len(events):,} events), end to end", "records/s",
                  len(lines) / elapsed, floor, Target.at_least(20_000, "records/s"),
                  extra={"events": len(events), **cpu})


async def cpu_now(env: Env) -> dict[str, float]:
    """CPU seconds so far of the ingest processes (this one's waited-for children), the daemon and Redis:
    less noisy than wall time on a shared machine."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    redis = await env.redis.info("cpu")
    return {"ingest_cpu_s": children.ru_utime + children.ru_stime, "daemon_cpu_s": cpu_seconds(env.daemon_pid),
            "redis_cpu_s": float(redis["used_cpu_user"]) + float(redis["used_cpu_sys"])}


async def bare_batches(env: Env, events: list[dict[str, Any]]) -> float:
    """Seconds of bare FCALL ms_emit of the events, BATCH a call, bodies built beforehand."""
    manager = env.manager()
    sid = await new_session(env, manager)
    session_json, stamp = json.dumps(sid), iso(now_ms())
    models = [EventIn.model_validate(event) for event in events]
    head: list[str | int] = [now_ms(), "bench", keys.session_channel(env.namespace, sid), session_json,
                             manager.settings.session_max_events]
    calls, seq = [], 0
    for first in range(0, len(models), BATCH):
        batch = models[first:first + BATCH]
        bodies = [event_body(event, "bench", session_json, stamp) for event in batch]
        calls.append([*head, *emit_args(batch, bodies, seq if sends_whole(bodies) else None)])
        seq += len(batch)  # as the daemon reads it before such a call
    fkeys = keys.session_keys(env.namespace, sid).all()
    start = time.perf_counter()
    for args in calls:
        await env.redis.fcall("ms_emit", len(fkeys), *fkeys, *args)
    return time.perf_counter() - start


Run = tuple[list[str], dict[str, str], list[bytes]]  # a command, its environment, one stdin per process


def walls(runs: dict[str, Run]) -> dict[str, tuple[list[float], list[float]]]:
    """Wall seconds and CPU seconds (user + system) of one process per input, for each run; the runs take
    turns, one process each, so that a load coming and going on a shared machine weighs on all alike."""
    out: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in runs}
    for turn in range(max(len(inputs) for _, _, inputs in runs.values())):
        for name, (command, env, inputs) in runs.items():
            if turn >= len(inputs):
                continue
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            done = subprocess.run(command, input=inputs[turn], env=env, capture_output=True, check=False)
            out[name][0].append(time.perf_counter() - start)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            out[name][1].append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
            if done.returncode != 0 or done.stdout or done.stderr:
                raise RuntimeError(f"{command} exited {done.returncode}: {done.stdout!r} {done.stderr!r}")
    return out


def spooled_lines(path: Path) -> int:
    """Inputs still in a spool (0 when it was never made)."""
    return len(path.read_text().splitlines()) if path.exists() else 0


def hook_inputs(count: int, sid: str) -> list[bytes]:
    """PreToolUse / PostToolUse pairs of Edits, as Claude Code sends them (files of the session's own: each
    session is its own agent, and another's claim would be answered with a warning)."""
    out = []
    for n in range(count):
        record: dict[str, Any] = {"session_id": sid, "cwd": "/repo", "tool_name": "Edit", "transcript_path": "/t",
                                  "tool_use_id": f"toolu_{n // 2}",
                                  "tool_input": {"file_path": f"/repo/{sid}/f{n // 2}.py"}}
        record["hook_event_name"] = "PreToolUse" if n % 2 == 0 else "PostToolUse"
        out.append(json.dumps(record).encode())
    return out


async def hook(env: Env) -> list[Figure]:
    """p99 wall ms of the hook process, daemon up and spool only, beside the bare interpreter's (the three
    take turns); with the median CPU ms per process, the figure a shared machine's steal does not move.

    The processes run without PYTHONDONTWRITEBYTECODE (a development shell may set it): an installed hook
    writes its bytecode on its first run, while with it set every process would compile again whichever of
    its modules changed since their bytecode was last written, and the figure would time the compiler."""
    count = 40 if env.quick else 200
    with tempfile.TemporaryDirectory() as tmp:
        unset = ("MEMENTO_URL", "PYTHONDONTWRITEBYTECODE")
        base = {key: value for key, value in os.environ.items() if key not in unset}
        up = {**base, "MEMENTO_DATA_DIR": f"{tmp}/up", "MEMENTO_TOKEN": env.token("claude"),
              "MEMENTO_URL": f"ws://127.0.0.1:{env.port}/ws"}
        away = {**base, "MEMENTO_DATA_DIR": f"{tmp}/away", "MEMENTO_TOKEN": env.token("claude")}
        warm = {**up, "MEMENTO_DATA_DIR": f"{tmp}/warm"}  # a first run: every module's bytecode written
        hook_command = [str(SCRIPT), "hook"]
        await anyio.to_thread.run_sync(walls, {"warm": (hook_command, warm, hook_inputs(1, "bench-warm"))})
        runs = {"bare": ([sys.executable, "-c", "pass"], base, [b""] * count),
                "up": (hook_command, up, hook_inputs(count, "bench-hook")),
                "away": (hook_command, away, hook_inputs(count, "bench-away"))}
        timed = await anyio.to_thread.run_sync(walls, runs)
        pending = await anyio.to_thread.run_sync(spooled_lines, Path(tmp, "up", "hook-spool", "spool.jsonl"))
    stored = int(await env.redis.hget(keys.session_keys(env.namespace, "bench-hook").session, "seq") or 0)
    (bare, bare_cpu), (delivered, up_cpu), (spooled, away_cpu) = timed["bare"], timed["up"], timed["away"]
    floor = pct(bare, 0.99) * 1000
    floors = {"floor_p50_ms": pct(bare, 0.5) * 1000, "floor_cpu_ms": pct(bare_cpu, 0.5) * 1000}
    return [Figure("hook process, daemon up (input delivered)", "ms p99", pct(delivered, 0.99) * 1000, floor,
                   Target.below_ms(200), higher_is_better=False,
                   extra={"p50_ms": pct(delivered, 0.5) * 1000, "cpu_ms": pct(up_cpu, 0.5) * 1000, **floors,
                          "stored": stored, "left_in_spool": pending}),
            Figure("hook process, daemon away (spool only)", "ms p99", pct(spooled, 0.99) * 1000, floor,
                   Target.below_ms(100), higher_is_better=False,
                   extra={"p50_ms": pct(spooled, 0.5) * 1000, "cpu_ms": pct(away_cpu, 0.5) * 1000, **floors})]
