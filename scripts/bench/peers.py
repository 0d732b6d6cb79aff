"""--peers: the OpenAI Agents SDK and Google ADK on this run's Redis and Postgres, beside memento's emits.

The peers are installed from PyPI into their own virtualenv (.bench-peers-venv/, made once and reused;
never the project's), and scripts/bench_peers.py runs there against this run's servers. Their rows show
memento's figure as the value and the peer's as the floor, so the ratio is memento / peer.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio

from bench.emit import sequential_emits
from bench.harness import PAYLOAD, Env, Figure, Target, median
from bench.watch import quiet, steal_ms

SCRIPTS = Path(__file__).resolve().parent.parent
PEERS_VENV = SCRIPTS.parent / ".bench-peers-venv"
PEERS_SCRIPT = SCRIPTS / "bench_peers.py"
# Pinned so that runs compare. SQLAlchemy and asyncpg by hand: ADK's "db" extra also pulls in Spanner. hiredis
# because the project's redis-py has it: the peer gets the same client and parser.
PEER_PACKAGES = ["openai-agents[redis]==0.24.0", "google-adk==2.13.0", "sqlalchemy[asyncio]>=2,<3", "asyncpg>=0.29",
                 "hiredis>=3"]
PEER_ROUNDS = 3  # sequential peer appends and memento's emits, alternated; each row takes the medians
NEEDS = ("emit", "emit-64")  # the sections the peer rows are ratios to


def peers_venv() -> Path:
    """The python of the peers' own virtualenv, made or brought up to PEER_PACKAGES when needed."""
    python, marker = PEERS_VENV / "bin" / "python", PEERS_VENV / "memento-peers.txt"
    wanted = "\n".join(PEER_PACKAGES)
    if python.exists() and marker.exists() and marker.read_text() == wanted:
        return python
    print(f"bench: installing the peers into {PEERS_VENV} (minutes, once) ...", file=sys.stderr, flush=True)
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--progress-bar", "off", *PEER_PACKAGES],
                   stdout=sys.stderr, check=True)
    marker.write_text(wanted)
    return python


async def measure(env: Env, python: Path, figures: list[Figure]) -> list[Figure]:
    """The peers' appends on this run's Redis and Postgres, each beside memento's emit of this run.

    The VM's speed drifts by tens of percent within a minute, so the sequential rows alternate: a peer
    round, then memento's sequential emits, PEER_ROUNDS times (once with --quick), and compare medians.
    """
    print("bench: peers ...", file=sys.stderr, flush=True)
    manager, rounds = env.manager(), 1 if env.quick else PEER_ROUNDS
    peers: dict[str, Any] = {}
    ours: list[float] = []
    sdk_seq: list[float] = []
    adk_seq: list[float] = []
    stolen = steal_ms()
    for round_ in range(rounds):
        await quiet(env)
        found = await run_peers(env, python, concurrent=round_ == 0)
        peers = peers or found
        sdk_seq.append(found["agents_sdk"]["sequential_per_s"])
        adk_seq.append(found["adk"]["sequential_per_s"])
        await quiet(env)
        ours.append(await sequential_emits(env, manager, 2000 if env.quick else 5000))
    print(peers_note(peers, rounds))
    mine = {f.name: f.value for f in figures}
    rounds_of = {f"round{i + 1}": v for i, v in enumerate(ours)}
    rows = [Figure("memento / Agents SDK RedisSession.add_items, seq", "events/s", median(ours), median(sdk_seq),
                   Target.ratio_at_least(5, of="peer"),
                   extra={**rounds_of, **{f"peer_round{i + 1}": v for i, v in enumerate(sdk_seq)}}),
            Figure("memento / Agents SDK RedisSession.add_items, 64 agents", "events/s",
                   mine["emit, in-process, 64 concurrent"], peers["agents_sdk"]["concurrent_per_s"]),
            Figure("memento / ADK DatabaseSessionService.append_event, seq", "events/s", median(ours),
                   median(adk_seq), Target.ratio_at_least(25, of="peer"),
                   extra={**rounds_of, **{f"peer_round{i + 1}": v for i, v in enumerate(adk_seq)}})]
    for row in rows:
        row.extra["section_steal_ms"] = steal_ms() - stolen
        row.judge()
    return rows


async def run_peers(env: Env, python: Path, concurrent: bool) -> dict[str, Any]:
    """One run of bench_peers.py in the peers' virtualenv: its JSON line."""
    seq, per_agent, adk = (300, 5, 200) if env.quick else (3000, 40, 1000)
    done = await anyio.run_process(
        [str(python), str(PEERS_SCRIPT), "--redis-url", env.redis_url,
         "--postgres-dsn", env.postgres_dsn, "--payload", json.dumps(PAYLOAD), "--sequential", str(seq),
         "--agents", "64" if concurrent else "0", "--per-agent", str(per_agent), "--adk-sequential", str(adk)],
        stderr=None)
    found: dict[str, Any] = json.loads(done.stdout.decode().splitlines()[-1])
    return found


def peers_note(peers: dict[str, Any], rounds: int) -> str:
    """What each peer row measured, in words."""
    sdk, adk = peers["agents_sdk"], peers["adk"]
    return (f"peers (value = memento's in-process emit of this run, floor = the peer, ratio = memento / peer; "
            f"sequential rows: medians of {rounds} alternated rounds of the peer and memento's emits): "
            f"openai-agents {sdk['version']} {sdk['api']} ({sdk['client']}) with PAYLOAD as {sdk['payload_as']}, "
            f"{sdk['redis_commands_per_append']:g} Redis commands per append (memento: 1 FCALL), "
            f"{sdk['sequential_count']} sequential on one session, {sdk['concurrent_agents']} agents x "
            f"{sdk['concurrent_per_agent']} concurrent, {sdk['concurrent_shape']} (memento's: one shared session); "
            f"google-adk {adk['version']} {adk['api']} on {adk['driver']} with PAYLOAD as {adk['payload_as']}, "
            f"{adk['sql_statements_per_append']:g} SQL statements per append, "
            f"{adk['sequential_count']} sequential on one session.")
