"""Heavy requests: the daemon's RSS growth for one fork, one suspend and one resume of a session, at two
session sizes, as MB of RSS per MB of session (the slope between the two sizes).

Growth is the daemon's peak RSS during the request (VmHWM, reset just before it through
/proc/<pid>/clear_refs) less its RSS before (VmRSS), both from /proc/<pid>/status. Each request and size is
weighed on a daemon of its own, on the run's servers, warmed first by the same request on a small session:
memory a heavy request freed stays with the process's allocator, and a later request reusing it would
show no growth at all. A daemon whose per-request memory is bounded by a setting, not by the session,
grows about as much for either size: a slope near 0.
"""

from __future__ import annotations

import contextlib
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.daemons import daemon
from bench.harness import Env, Figure, Rpc, Target
from bench.tenant import MB, Tenant, heavy_session, session_mb, tenant_ws, unlink_session

OPS = ("fork", "suspend", "resume")
SLOPE = 0.25  # MB of RSS per MB of session
WARM_MB = 0.15  # the warming session: ten events


async def heavy_rss(env: Env) -> list[Figure]:
    """Each request at each size on a fresh daemon; one figure per request."""
    tenant = Tenant.new("heavy")
    sizes = (2, 16) if env.quick else (5, 40)
    points: dict[str, list[tuple[float, float]]] = {op: [] for op in OPS}  # (session MB, growth MB)
    with tempfile.TemporaryDirectory(prefix="memento-bench-heavy-") as tmp:
        for size in sizes:
            sid, seq = await heavy_session(env, tenant, size)
            megabytes = await session_mb(env, tenant, sid)
            for op in OPS:  # in this order: the resume's session is the one the suspend moved
                points[op].append((megabytes, await weighed(env, tenant, Path(tmp) / f"{op}-{size}", op,
                                                            (sid, seq))))
            await unlink_session(env, tenant, sid)
    return [figure(op, found) for op, found in points.items()]


async def weighed(env: Env, tenant: Tenant, data: Path, op: str, session: tuple[str, int]) -> float:
    """`weigh`, or NaN (said on stderr) when the daemon refused the request: the run's figures still print."""
    try:
        return await weigh(env, tenant, data, op, session)
    except RuntimeError as exc:  # a JSON-RPC error
        print(f"bench: heavy-rss: the {op} was refused: {exc}", file=sys.stderr, flush=True)
        return math.nan


async def weigh(env: Env, tenant: Tenant, data: Path, op: str, session: tuple[str, int]) -> float:
    """MB the request grew a fresh daemon's RSS by, after the same request on a small session."""
    warm = await heavy_session(env, tenant, WARM_MB)
    async with (daemon(env.redis_url, env.postgres_dsn, data, falkordb_url=env.falkordb_url) as fresh,
               tenant_ws(env, tenant, op, fresh.port) as rpc):
        if op == "resume":
            await request(env, tenant, rpc, "suspend", warm)
        await request(env, tenant, rpc, op, warm)
        before = status_kb(fresh.pid)["VmRSS"]
        reset_peak(fresh.pid)
        await request(env, tenant, rpc, op, session)
        growth = (status_kb(fresh.pid)["VmHWM"] - before) * 1024 / MB
    await unlink_session(env, tenant, warm[0])
    return growth


async def request(env: Env, tenant: Tenant, rpc: Rpc, op: str, session: tuple[str, int]) -> None:
    """session.<op> of the session (a fork of all of it, removed once made)."""
    sid, seq = session
    params: dict[str, Any] = {"sessionId": sid} | ({"atSeq": seq} if op == "fork" else {})
    reply = await rpc.call(f"session.{op}", params)
    if op == "fork":
        await unlink_session(env, tenant, str(reply["sessionId"]))


def status_kb(pid: int) -> dict[str, int]:
    """The kB lines of /proc/<pid>/status (VmRSS, VmHWM, ...), as numbers."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if value.strip().endswith(" kB"):
            found[name] = int(value.split()[0])
    return found


def reset_peak(pid: int) -> None:
    """Reset the process's peak RSS (VmHWM) to its RSS now; a kernel without it keeps the start-up peak."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/clear_refs").write_text("5")


def figure(op: str, points: list[tuple[float, float]]) -> Figure:
    """The slope between the two sizes, each size's growth beside it."""
    (small_mb, small), (large_mb, large) = points
    return Figure(f"heavy-rss: daemon RSS growth of one {op}, per MB of session", "MB/MB",
                  (large - small) / (large_mb - small_mb), None, Target.under(SLOPE, "MB of RSS per MB of session"),
                  higher_is_better=False, extra={"small_session_mb": small_mb, "small_growth_mb": small,
                                                 "large_session_mb": large_mb, "large_growth_mb": large})
