"""The daemon's background loops go on after a failed pass.

Each loop runs in the daemon's task group, so an exception escaping one pass used to end the whole
daemon. Here each loop's pass is made to raise a bug (a KeyError, which no loop expects) once, and the
loop must log it and run its next pass against the real backends.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

from memento_sessions.backends import Backends
from memento_sessions.checkpoints import checkpointer as checkpointer_module
from memento_sessions.checkpoints.checkpointer import Checkpointer
from memento_sessions.checkpoints.snapshots import Snapshots
from memento_sessions.kg.graph import Graphs
from memento_sessions.lifecycle import methods as lifecycle_methods
from memento_sessions.lifecycle.methods import LifecycleService
from memento_sessions.logs import one_pass
from memento_sessions.sessions import janitor as janitor_module
from memento_sessions.sessions.manager import SessionManager
from memento_sessions.settings import Settings

pytestmark = pytest.mark.anyio


class FailsOnce:
    """Wraps a real pass: the first call raises a KeyError (a bug, not a backend away), later ones run it."""

    def __init__(self, real: Callable[..., Awaitable[Any]]) -> None:
        self.real, self.calls = real, 0
        self.results: list[Any] = []

    async def __call__(self, *args: Any) -> Any:
        self.calls += 1
        if self.calls == 1:
            raise KeyError("a bug in one pass")
        result = await self.real(*args)
        self.results.append(result)
        return result


async def until_passed(wrapper: FailsOnce, times: int) -> None:
    """Wait until the loop has run `times` passes since its failed one."""
    with anyio.fail_after(10):
        while len(wrapper.results) < times:
            await anyio.sleep(0.01)


async def test_one_pass_returns_the_result_or_logs_the_failure() -> None:
    async def seven() -> int:
        return 7

    async def away() -> int:
        raise ConnectionError("backend away")

    async def bug() -> int:
        raise KeyError("bug")

    with capture_logs() as logs:
        assert await one_pass(seven, "sum") == 7
        assert await one_pass(away, "probe", (ConnectionError,)) is None
        assert await one_pass(bug, "probe", (ConnectionError,)) is None
    assert [(entry["log_level"], entry["job"], "exc_info" in entry) for entry in logs] == [
        ("warning", "probe", False),  # expected: one line, no traceback
        ("error", "probe", True),  # a bug: logged with its traceback
    ]
    assert "backend away" in logs[0]["error"]


async def test_one_pass_lets_cancellation_through() -> None:
    with anyio.move_on_after(0.05) as scope:
        await one_pass(lambda: anyio.sleep(10), "sleep", (Exception,))
    assert scope.cancelled_caught


async def test_the_index_janitor_sweeps_again_after_a_failed_pass(backends: Backends,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    sweep = FailsOnce(janitor_module.sweep)
    monkeypatch.setattr(janitor_module, "sweep", sweep)
    monkeypatch.setattr(janitor_module, "INTERVAL", 0.01)
    with capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            tg.start_soon(janitor_module.janitor, backends.redis)
            await until_passed(sweep, 2)
            tg.cancel_scope.cancel()
    assert all(isinstance(live, int) for live in sweep.results) and sweep.calls >= 3
    assert any(entry["job"] == "index sweep" and entry["log_level"] == "error" for entry in logs)


async def test_the_lifecycle_loop_runs_again_after_a_failed_pass(settings: Settings, backends: Backends,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    manager = SessionManager(backends.redis, settings)
    await manager.start()
    service = LifecycleService(manager, backends)
    move = FailsOnce(service.move)
    monkeypatch.setattr(service, "move", move)
    monkeypatch.setattr(lifecycle_methods, "IDLE_EVERY", 0.01)
    async with anyio.create_task_group() as tg:
        tg.start_soon(service.run)
        await until_passed(move, 2)
        tg.cancel_scope.cancel()
    assert all(isinstance(done, tuple) for done in move.results) and move.calls >= 3


async def test_the_snapshot_flush_runs_again_after_a_failed_pass(settings: Settings, backends: Backends,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    checkpointer = Checkpointer(settings, backends, SessionManager(backends.redis, settings), Graphs(backends),
                                Snapshots(backends.postgres))
    flush = FailsOnce(checkpointer.pending.flush)
    monkeypatch.setattr(checkpointer.pending, "flush", flush)
    monkeypatch.setattr(checkpointer_module, "FLUSH_EVERY", 0.01)
    monkeypatch.setattr(checkpointer_module, "FLUSH_MAX_DELAY", 0.02)
    async with anyio.create_task_group() as tg:
        await tg.start(checkpointer.run)  # its flush loop runs beside the workers
        await until_passed(flush, 2)
        tg.cancel_scope.cancel()
    assert all(isinstance(stored, int) for stored in flush.results) and flush.calls >= 3
