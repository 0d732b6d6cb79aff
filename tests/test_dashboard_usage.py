"""The dashboard's usage panel in a real headless Chromium against an in-process daemon: tokens and cost per
agent and per session, the namespace's spend per hour as bars, updates without a reload, a cost the source
did not give shown as unknown (never 0), and a usage reply of another shape shown as text."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest

from memento_sessions.dashboard import CSP
from memento_sessions.server.daemon import Daemon
from tests import test_dashboard, test_dashboard_robust
from tests.browser import Browser, run
from tests.helpers import token
from tests.rpcsocket import rpc
from tests.test_dashboard import IMAGES, login, row

pytestmark = pytest.mark.anyio
site, browser = test_dashboard.site, test_dashboard.browser  # the fixtures: the daemon's page, a Chromium

AGENTS = ("return Object.fromEntries([...document.querySelectorAll('#u-agents .line[data-agent]')]"
          ".map(l => [l.dataset.agent, [Number(l.dataset.input), Number(l.dataset.output), l.dataset.cost,"
          " l.textContent]]))")
SESSIONS = ("return Object.fromEntries([...document.querySelectorAll('#u-sessions .line[data-session]')]"
            ".map(l => [l.dataset.session, [Number(l.dataset.input), Number(l.dataset.output), l.dataset.cost]]))")
BARS = ("return [...document.querySelectorAll('#spend rect.bar')].map(b => [b.dataset.hour, Number(b.dataset.cost),"
        " Number(b.dataset.runs), Number(b.dataset.unknown), Number(b.getAttribute('height'))])")


def stamp(at: datetime) -> str:
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def one_run(n: int, at: datetime, inputs: int, output: int, cost: float | None) -> list[dict[str, Any]]:
    """One prompt's turn as a client emits it: the prompt, one model call's usage, the end (with the source's cost)."""
    end = {"id": f"e{n}", "type": "query:completed", "timestamp": stamp(at + timedelta(seconds=3)),
           "data": {} if cost is None else {"totalCostUsd": cost}}
    return [{"id": f"p{n}", "type": "query:started", "timestamp": stamp(at), "data": {"prompt": f"task {n}"}},
            {"id": f"u{n}", "type": "usage", "timestamp": stamp(at + timedelta(seconds=1)),
             "data": {"messageId": f"m{n}", "model": "claude-y", "apiCalls": 1, "inputTokens": inputs,
                      "outputTokens": output}},
            end]


async def test_usage_per_agent_and_session_with_hourly_bars_updates_live(site: str, daemon: Daemon, namespace: str,
                                                                        browser: Browser) -> None:
    now = datetime.now(UTC)
    two_hours_ago = now - timedelta(hours=2)
    async with rpc(daemon.port, token("alice", namespace)) as alice, rpc(daemon.port, token("bob", namespace)) as bob:
        await alice.call("session.create", {"sessionId": "s-alice"})
        await bob.call("session.create", {"sessionId": "s-bob"})
        await alice.call("event.emitBatch", {"sessionId": "s-alice", "events": [
            *one_run(1, two_hours_ago, 1000, 200, 0.25), *one_run(2, now, 300, 40, 0.5)]})
        await bob.call("event.emitBatch", {"sessionId": "s-bob", "events": one_run(1, now, 7000, 900, None)})
        await login(browser, site, "viewer", namespace)
        await run(browser.wait, AGENTS + ".bob", timeout=15)
        agents = await run(browser.js, AGENTS)
        assert agents["alice"][:3] == [1300, 240, "0.75"] and agents["alice"][3].endswith("$0.7500")
        # bob's source gave no cost: unknown, never $0.
        assert agents["bob"][:3] == [7000, 900, "unknown"] and agents["bob"][3].endswith("cost unknown")
        assert await run(browser.js, SESSIONS) == {"s-alice": [1300, 240, "0.75"], "s-bob": [7000, 900, "unknown"]}
        total = await run(browser.js, "return document.querySelector('#u-total').textContent")
        assert total == "namespace 8300 in · 1140 out · $0.7500 + unknown (1 run)"
        # Two hours with runs: two hours ago alice's $0.25; this hour alice's $0.50 and bob's run of unknown cost.
        bars = await run(browser.js, BARS)
        hour = now.replace(minute=0, second=0, microsecond=0)
        assert [bar[:4] for bar in bars] == [[stamp(hour - timedelta(hours=2)), 0.25, 1, 0],
                                             [stamp(hour), 0.5, 2, 1]]
        assert bars[1][4] > bars[0][4] > 0  # the dearer hour is the taller bar
        await run(browser.screenshot, IMAGES / "dashboard-usage.png")
        # A later run appears without a reload.
        await alice.call("event.emitBatch", {"sessionId": "s-alice", "events": one_run(3, now, 10, 5, 1.25)})
        await run(browser.wait, AGENTS + ".alice[2] === '2'", timeout=15)
        assert (await run(browser.js, AGENTS))["alice"][:2] == [1310, 245]
        await run(browser.wait, BARS + ".some(b => b[1] === 1.75 && b[2] === 3)", timeout=15)


async def test_a_malformed_usage_reply_is_shown_as_text_and_breaks_nothing(site: str, daemon: Daemon, namespace: str,
                                                                          browser: Browser) -> None:
    await run(test_dashboard_robust.tap, browser)
    async with rpc(daemon.port, token("alice", namespace)) as alice:
        await alice.call("session.create", {"sessionId": "s1"})
        await alice.call("event.emitBatch", {"sessionId": "s1", "events": one_run(1, datetime.now(UTC), 5, 6, 0.1)})
    await login(browser, site, "viewer", namespace)
    await run(browser.wait, AGENTS + ".alice", timeout=15)
    assert len(await run(browser.js, BARS)) == 1
    await run(browser.js, "window.__replies['usage.get'] = {totals: {costUsd: 'free', runs: 1},"
                          " runs: [1, null, {startedAt: 'soon'}], nextCursor: 7}")
    await run(browser.wait, "return document.querySelector('#u-agents .line[data-malformed]')", timeout=15)
    assert await run(browser.js, "return document.querySelector('#u-agents .line').textContent") == \
        'alice {"totals":{"costUsd":"free","runs":1},"runs":[1,null,{"startedAt":"soon"}],"nextCursor":7}'
    assert (await run(browser.js, "return document.querySelector('#u-total').textContent")).startswith('{"totals"')
    assert await run(browser.js, BARS) == []
    await run(browser.js, "window.__replies['usage.get'] = 'nothing'")
    await run(browser.wait, "return document.querySelector('#u-sessions .line').textContent === 's1 nothing'",
              timeout=15)
    # The rest of the page is unharmed: the sessions list still lists and opens.
    await run(browser.click, row("s1"))
    await run(browser.wait, "return document.querySelector('#timeline .row[data-seq=\"3\"]')")


async def test_the_usage_script_is_served_like_the_page_and_loads_nothing_from_elsewhere(site: str) -> None:
    status, headers, js = await anyio.to_thread.run_sync(test_dashboard.fetch, f"{site}/dashboard/usage.js")
    assert status == 200 and headers["content-type"] == "text/javascript; charset=utf-8"
    assert headers["content-security-policy"] == CSP
    assert b"https://" not in js and b"http://" not in js
