"""A restart of `memento-sessions serve` after a bulk graph load is ready fast: the AOF stays compact, and the
daemon imports only what it needs to serve (the MCP SDK waits for the first /mcp request)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import redis

from memento_sessions.auth import issue_token
from memento_sessions.embedded.datadir import auth_secret
from memento_sessions.embedded.redis import EmbeddedRedis
from tests.test_daemon_process import Serve, wait_for

pytestmark = pytest.mark.slow
NODES = 10_000
READY_WITHIN = 2.0
CPU_WITHIN = 1.5  # the daemon's own CPU seconds to ready: 2.0 to 3.0 when it imported the MCP SDK at start
CLK_TCK = os.sysconf("SC_CLK_TCK")


def kg_load(data_dir: Path, path: Path) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("MEMENTO_")}
    return subprocess.run([sys.executable, "-m", "memento_sessions.cli", "kg", "load", str(path),
                           "--data-dir", str(data_dir)], env=env, capture_output=True, text=True, timeout=300)


def incr_aof_bytes(data_dir: Path) -> int:
    return sum(path.stat().st_size for path in (data_dir / "falkordb" / "appendonlydir").glob("*.incr.aof"))


def test_a_restart_after_loading_a_10000_node_graph_is_ready_within_2s(tmp_path: Path) -> None:
    """The embedded Redis alone, then the whole daemon, restarted on a 10,000-node graph: each ready within 2 s.

    The whole daemon's 2 s are checked as they are on a quiet machine; on a busy one (other engineers' tests
    on 2 cores), the CPU seconds other processes used meanwhile, divided by the cores, are added. The
    daemon's own CPU seconds to ready, which others' load hardly changes, must stay under 1.5.
    """
    data_dir = tmp_path / "data"
    load_graph(data_dir, tmp_path / "kg.jsonl")
    redis_server = EmbeddedRedis(data_dir / "falkordb", name="falkordb")  # the graphs' own server
    started = time.monotonic()
    redis_server.start()
    try:
        redis_ready = time.monotonic() - started
        count = redis.Redis.from_url(redis_server.url).execute_command(  # type: ignore[no-untyped-call]  # ready: no LOADING
            "GRAPH.QUERY", "memento", "MATCH (n:Symbol) RETURN count(n)")
    finally:
        redis_server.stop()
    assert count[1] == [[NODES]]
    assert redis_ready < READY_WITHIN
    restart = Restart(data_dir)
    print(f"\nrestart with a {NODES}-node graph: embedded Redis ready (data loaded) after {redis_ready:.2f}s; "
          f"{restart}")
    assert restart.cpu < CPU_WITHIN, f"the daemon used {restart.cpu:.2f} CPU seconds to be ready"
    assert restart.ready < restart.allowed, f"{restart}: later than the {READY_WITHIN}s target plus others' load"
    assert restart.mcp < 15.0, "/mcp answers soon after ready (the first request imports the MCP SDK)"


def test_the_daemon_gets_ready_without_importing_the_mcp_sdk() -> None:
    """Everything the daemon imports before serving, in a fresh interpreter: not the MCP SDK (a CPU second),
    which /mcp imports on its first request (mcp/http.py)."""
    probe = ("import sys; from memento_sessions.cli import commands; "
             "from memento_sessions.server import daemon, handshake; commands.build_parser(); daemon.load_services(); "
             "print(sorted(name for name in sys.modules if name.split('.')[0] in ('mcp', 'mcp_types')))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


class Restart:
    """One `serve` restarted on `data_dir`: seconds to /readyz 200 and to a first /mcp answer, its CPU."""

    def __init__(self, data_dir: Path) -> None:
        before, ours = busy_ticks(), time.process_time()  # this test's own polling is not "others"
        started = time.monotonic()
        serve = Serve(data_dir)
        try:
            wait_for(serve, 200, 30)
            self.ready = time.monotonic() - started
            polling = (time.process_time() - ours) * CLK_TCK
            others = busy_ticks() - before - tree_ticks(serve.proc.pid) - polling
            self.mcp = mcp_answers(serve) - started - self.ready
        finally:
            assert serve.stop() == 0
        self.cpu = ready_cpu(serve)
        self.others = max(others, 0) / CLK_TCK
        self.allowed = READY_WITHIN + self.others / (os.cpu_count() or 1)

    def __str__(self) -> str:
        return (f"daemon's /readyz 200 after {self.ready:.2f}s (allowed {self.allowed:.2f}s: other processes "
                f"used {self.others:.2f} CPU s meanwhile), {self.cpu:.2f} CPU s of its own; "
                f"first /mcp answer {self.mcp:.2f}s after ready")


def busy_ticks() -> int:
    """CPU ticks the machine spent busy so far, on every core (idle and iowait excluded, steal included)."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, Path("/proc/stat").read_text().split()[1:9])
    return user + nice + system + irq + softirq + steal


def tree_ticks(pid: int) -> int:
    """CPU ticks used by `pid` and every descendant alive (those reaped are in their parent's count)."""
    stats = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        stats[int(proc.name)] = (int(fields[1]), sum(map(int, fields[11:15])))  # ppid; utime stime cutime cstime
    tree, total = [pid], 0
    while tree:
        current = tree.pop()
        total += stats.get(current, (0, 0))[1]
        tree += [child for child, (parent, _) in stats.items() if parent == current]
    return total


def ready_cpu(serve: Serve) -> float:
    """The CPU seconds the daemon says it used to be ready (server/health.py, log_ready)."""
    lines = [json.loads(line) for line in Path(serve.log.name).read_text().splitlines() if line.startswith("{")]
    return float(next(line["cpu_seconds"] for line in lines if line.get("event") == "ready"))


def mcp_answers(serve: Serve) -> float:
    """The monotonic time an MCP initialize on /mcp is answered."""
    tok = issue_token(auth_secret(serve.data_dir), "agent-r")
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}})
    request = urllib.request.Request(f"http://127.0.0.1:{serve.port}/mcp", data=body.encode(), method="POST", headers={
        "authorization": f"Bearer {tok}", "accept": "application/json, text/event-stream",
        "content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
        assert '"serverInfo"' in response.read().decode()
    return time.monotonic()


def load_graph(data_dir: Path, path: Path) -> None:
    """A daemon on `data_dir`, a 10,000-node `kg load` through it, and a clean stop."""
    serve = Serve(data_dir)
    try:
        wait_for(serve, 200, 60)
        path.write_text("".join(json.dumps({"node": {"id": f"fn-{i}", "labels": ["Symbol"],
                                                     "props": {"name": f"f{i}", "line": i}}}) + "\n"
                                for i in range(NODES)))
        loaded = kg_load(data_dir, path)
        assert loaded.returncode == 0, loaded.stderr
        assert f"loaded {NODES} nodes and 0 edges" in loaded.stdout
        assert incr_aof_bytes(data_dir) < 64 * 1024, "the load's GRAPH.QUERY commands were not rewritten"
        assert serve.stop() == 0
    finally:
        if serve.proc.poll() is None:
            serve.proc.kill()
