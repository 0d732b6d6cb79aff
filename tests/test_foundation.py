"""The daemon's port: health, readiness, metrics, the WebSocket handshake and JSON-RPC framing."""

from __future__ import annotations

import gc
import json
import logging
import subprocess
import sys
from typing import cast

import anyio
import httpx2
import jwt
import pytest
from prometheus_client import REGISTRY
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from memento_sessions.auth import issue_token
from memento_sessions.errors import ConfigError
from memento_sessions.server.daemon import Daemon
from memento_sessions.settings import load_settings
from tests.helpers import SECRET, token
from tests.rpcsocket import rpc

pytestmark = pytest.mark.anyio


async def test_healthz_readyz_and_metrics(daemon: Daemon) -> None:
    async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{daemon.port}") as http:
        assert (await http.get("/healthz")).json() == {"status": "ok"}
        ready = await _wait_ready(http)
        assert ready == {"ready": True, "backends": {"redis": "up", "falkordb": "up", "postgres": "up"}}
        metrics = (await http.get("/metrics")).text
    assert 'memento_build_info{version="' in metrics
    assert "process_resident_memory_bytes" in metrics


async def test_the_daemon_times_each_collector_pause(daemon: Daemon) -> None:
    def count(generation: str) -> float:
        return REGISTRY.get_sample_value("memento_gc_pause_seconds_count", {"generation": generation}) or 0.0

    before = count("2")
    gc.collect()  # a full collection, as the collector runs one on its own
    assert count("2") == before + 1
    async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{daemon.port}") as http:
        assert 'memento_gc_pause_seconds_count{generation="2"}' in (await http.get("/metrics")).text


async def _wait_ready(http: httpx2.AsyncClient) -> object:
    import anyio

    with anyio.fail_after(5):
        while (response := await http.get("/readyz")).status_code != 200:
            await anyio.sleep(0.05)
    return response.json()


@pytest.mark.parametrize("bad", ["missing", "expired", "forged", "garbage"])
async def test_websocket_without_valid_token_is_refused_with_401(daemon: Daemon, bad: str) -> None:
    tokens = {
        "missing": None,
        "expired": token("agent-a", ttl=-10),
        "forged": jwt.encode({"sub": "agent-a", "ns": "default", "scope": "admin", "exp": 2**33},
                             "not-the-secret-but-long-enough-0123456789", algorithm="HS256"),
        "garbage": "abc.def.ghi",
    }
    headers = {"Authorization": f"Bearer {tokens[bad]}"} if tokens[bad] else {}
    with pytest.raises(InvalidStatus) as refused:
        async with connect(f"ws://127.0.0.1:{daemon.port}/ws", additional_headers=headers):
            pass
    assert refused.value.response.status_code == 401


@pytest.mark.parametrize(("claims", "reason"), [
    ({"sub": "agent-a", "scope": "admin"}, "invalid token: no 'ns' claim"),
    ({"ns": "default", "scope": "admin"}, "invalid token: no 'sub' claim"),
])
async def test_a_token_without_ns_or_sub_is_refused_naming_the_claim(daemon: Daemon, claims: dict[str, str],
                                                                      reason: str) -> None:
    forged = jwt.encode({**claims, "exp": 2**33}, SECRET, algorithm="HS256")
    headers = {"Authorization": f"Bearer {forged}"}
    with pytest.raises(InvalidStatus) as refused:
        async with connect(f"ws://127.0.0.1:{daemon.port}/ws", additional_headers=headers):
            pass
    assert refused.value.response.status_code == 401
    assert json.loads(refused.value.response.body) == {"error": reason}


@pytest.mark.parametrize(("claims", "reason"), [
    ({"sub": "agent-a\n", "ns": "default"}, "invalid token subject"),
    ({"sub": "agent-a", "ns": "default\n"}, "invalid token namespace"),
    ({"sub": "agent-a", "ns": "default", "roles": ["dev\n"]}, "invalid token roles: 'dev\\n' is not 1..64 chars of "
                                                              "[A-Za-z0-9._-]"),
])
async def test_a_signed_name_ending_in_a_newline_is_refused(daemon: Daemon, claims: dict[str, object],
                                                            reason: str) -> None:
    """`$` matches before a trailing newline: such a name passed, and went into Redis keys as it was."""
    signed = jwt.encode({**claims, "scope": "admin", "exp": 2**33}, SECRET, algorithm="HS256")
    with pytest.raises(InvalidStatus) as refused:
        async with connect(f"ws://127.0.0.1:{daemon.port}/ws", additional_headers={"Authorization": f"Bearer {signed}"}
                           ):
            pass
    assert refused.value.response.status_code == 401
    assert json.loads(refused.value.response.body) == {"error": reason}
    with pytest.raises(ValueError):  # nor does the CLI's `token` sign one
        roles = tuple(cast(list[str], claims.get("roles", [])))
        issue_token(SECRET, str(claims["sub"]), str(claims["ns"]), roles=roles)


async def test_token_in_query_string_is_accepted(daemon: Daemon) -> None:
    async with connect(f"ws://127.0.0.1:{daemon.port}/ws?token={token('agent-q')}") as ws:
        await ws.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "no.such"}))
        assert json.loads(await ws.recv())["error"]["code"] == -32601


async def test_bad_frames_get_errors_and_the_connection_stays_usable(daemon: Daemon) -> None:
    async with rpc(daemon.port, token("agent-a")) as peer:
        assert (await peer.send_raw("{not json"))["error"]["code"] == -32700
        assert (await peer.send_raw("[1, 2]"))["error"]["code"] == -32600
        assert (await peer.send_raw('{"jsonrpc": "1.0", "id": 3, "method": "x"}'))["error"]["code"] == -32600
        assert (await peer.send_raw('{"jsonrpc": "2.0", "id": true, "method": "x"}'))["error"]["code"] == -32600
        unknown = await peer.error("no.such.method", {})
        assert unknown["code"] == -32601 and unknown["data"] == {"method": "no.such.method"}


def test_bad_setting_names_the_variable() -> None:
    with pytest.raises(ConfigError, match=r"^invalid MEMENTO_SESSION_TTL: .*less than or equal to 86400"):
        load_settings(session_ttl=90000)
    with pytest.raises(ConfigError, match=r"^invalid MEMENTO_REDIS_SPIN_US: .*greater than or equal to 0"):
        load_settings(redis_spin_us=-1)
    with pytest.raises(ConfigError, match=r"^invalid MEMENTO_REDIS_URL: must start with"):
        load_settings(redis_url="http://x")


@pytest.mark.parametrize(("name", "default", "low", "high"), [
    ("port", 8765, 0, 65535), ("embedded_redis_port", 0, 0, 65535), ("embedded_postgres_port", 0, 0, 65535),
    ("anchor_max_age_days", 7, 1, 3650), ("snapshot_max_age_days", 30, 1, 3650), ("archive_after_days", 30, 1, 3650),
    ("ws_rate_limit", 5000.0, 0.0, 1_000_000.0), ("mcp_rate_limit", 1000.0, 0.0, 1_000_000.0),
])
def test_settings_that_share_bounds_keep_their_variable_default_and_bounds(
        name: str, default: float, low: float, high: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """Port, Days and Rate (settings.py) are the bounds of several settings: each setting keeps its own."""
    variable = f"MEMENTO_{name.upper()}"
    monkeypatch.delenv(variable, raising=False)
    assert getattr(load_settings(), name) == default
    monkeypatch.setenv(variable, str(high))
    assert getattr(load_settings(), name) == high
    for bad, bound in ((low - 1, "greater than or equal to"), (high + 1, "less than or equal to")):
        monkeypatch.setenv(variable, str(bad))
        with pytest.raises(ConfigError, match=rf"^invalid {variable}: .*{bound}"):
            load_settings()


def test_serve_with_a_bad_variable_exits_2_with_one_line(tmp_path: object) -> None:
    env = {"MEMENTO_CHECKPOINT_EVERY": "zero", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "memento_sessions.cli", "serve"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "memento-sessions: invalid MEMENTO_CHECKPOINT_EVERY: Input should be a valid integer, "
        "unable to parse string as an integer"
    ]


def test_token_command_prints_a_verifiable_token() -> None:
    env = {"MEMENTO_AUTH_SECRET": SECRET, "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "memento_sessions.cli", "token", "--agent", "a1",
                           "--namespace", "team", "--scope", "sessions:read", "kg:write", "--ttl", "60"],
                          env=env, capture_output=True, text=True, timeout=60, check=True)
    claims = jwt.decode(done.stdout.strip(), SECRET, algorithms=["HS256"])
    assert (claims["sub"], claims["ns"], claims["scope"]) == ("a1", "team", "sessions:read kg:write")


def test_every_command_has_help() -> None:
    for command in ([], ["serve"], ["token"], ["check"]):
        done = subprocess.run([sys.executable, "-m", "memento_sessions.cli", *command, "--help"],
                              capture_output=True, text=True, timeout=60, check=True)
        assert "usage: memento-sessions" in done.stdout


def test_serve_on_a_busy_port_exits_2_naming_the_variables() -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = {"MEMENTO_PORT": str(port), "MEMENTO_REDIS_URL": "redis://127.0.0.1:1/0", "MEMENTO_POSTGRES_DSN": "off",
               "MEMENTO_AUTH_SECRET": SECRET, "PATH": "/usr/bin:/bin"}
        done = subprocess.run([sys.executable, "-m", "memento_sessions.cli", "serve"], env=env,
                              capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        f"memento-sessions: cannot listen on 127.0.0.1:{port} (MEMENTO_HOST/MEMENTO_PORT): Address already in use")


async def test_with_redis_down_at_start_the_daemon_serves_and_says_so(backend_urls: object, tmp_path: object) -> None:
    from pathlib import Path

    from memento_sessions.server.daemon import running
    from tests.helpers import make_settings

    assert isinstance(tmp_path, Path)
    # FalkorDB on that Redis too (in the cluster run make_settings would name the standalone one, which is up)
    settings = make_settings(backend_urls, tmp_path, redis_url="redis://127.0.0.1:1/0",  # type: ignore[arg-type]
                             falkordb_url=None)
    with anyio.fail_after(20):
        async with running(settings) as down:
            async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{down.port}") as http:
                assert (await http.get("/healthz")).status_code == 200
                await anyio.sleep(0.5)
                ready = await http.get("/readyz")
            assert ready.status_code == 503
            assert ready.json()["backends"] == {"redis": "down", "falkordb": "down", "postgres": "up"}
            async with rpc(down.port, token("a")) as peer:
                error = await peer.error("session.create", {})
            assert error["code"] == -32050 and "Redis" in error["message"]


async def test_uvicorn_never_logs_a_websocket_token(daemon: Daemon, caplog: pytest.LogCaptureFixture) -> None:
    secret = token("logged", "default")
    with caplog.at_level(logging.INFO, logger="uvicorn.error"):
        async with connect(f"ws://127.0.0.1:{daemon.port}/ws?token={secret}") as ws:  # the query-string way in
            await ws.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "session.list", "params": {}}))
            assert "result" in json.loads(await ws.recv())
    accepted = [r.getMessage() for r in caplog.records if "[accepted]" in r.getMessage()]
    assert accepted and all("token=***" in line for line in accepted), accepted
    assert not any(secret in r.getMessage() for r in caplog.records)


def test_a_logger_used_before_logging_is_configured_again_follows_the_new_configuration() -> None:
    """With loggers cached on first use, a module that had logged once kept the chain of that moment: after a
    command run in-process configured logging again, a test's capture_logs (or the new format) missed it. The
    suite's one failure of this kind was the lease reaper's log after an in-process `ingest`."""
    from structlog.testing import capture_logs

    from memento_sessions.logs import configure_logging, get_logger

    log = get_logger("tests.reconfigured")
    log.debug("first use")  # below the level: dropped, but the logger was used
    configure_logging("console", "warning")
    with capture_logs() as entries:
        log.warning("after the second configure")
    assert [entry["event"] for entry in entries] == ["after the second configure"]
