"""The dashboard against what a careless or hostile agent may store, and the sessions a user looks for: event
content is only ever text, a malformed event never breaks a row or a panel, every status can be listed, a
suspension while the page is open keeps the row, a transition is drawn only where the state changed, and the
filters follow `change` as well as `input`. In a real headless Chromium against an in-process daemon."""

from __future__ import annotations

import json
from typing import Any

import pytest

from memento_sessions.server.daemon import Daemon
from tests import test_dashboard
from tests.browser import Browser, run
from tests.helpers import token
from tests.rpcsocket import rpc
from tests.test_dashboard import login, open_session, row

pytestmark = pytest.mark.anyio
site, browser = test_dashboard.site, test_dashboard.browser  # the fixtures: the daemon's page, a Chromium

# Installed before the page's own script: keeps the page's WebSocket reachable, so a test can deliver what a
# daemon could send (a notification) and answer chosen methods itself (their `result` in window.__replies).
TAP = """
const Native = window.WebSocket;
window.__replies = {};
window.WebSocket = class extends Native {
  constructor(...args) { super(...args); window.__ws = this; }
  send(text) {
    const msg = JSON.parse(text);
    if (msg.method in window.__replies) {
      const reply = JSON.stringify({jsonrpc: "2.0", id: msg.id, result: window.__replies[msg.method]});
      setTimeout(() => this.onmessage({data: reply}), 0);
    } else super.send(text);
  }
};
"""


def tap(browser: Browser) -> None:
    browser.driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": TAP})


async def deliver(browser: Browser, method: str, params: dict[str, Any]) -> None:
    note = json.dumps({"jsonrpc": "2.0", "method": method, "params": params})
    await run(browser.js, "window.__ws.onmessage({data: arguments[0]})", note)


def text_of(seq: int) -> str:
    return f"return document.querySelector('#timeline .row[data-seq=\"{seq}\"]').textContent"


async def test_malformed_events_show_as_text_and_break_no_row_or_panel(site: str, daemon: Daemon,
                                                                      namespace: str, browser: Browser) -> None:
    await run(tap, browser)
    await login(browser, site, "viewer", namespace)
    async with rpc(daemon.port, token("alice", namespace)) as alice:
        sid = (await alice.call("session.create", {"entityIds": ["fn:parse"]}))["sessionId"]
        await open_session(browser, sid)
        await run(browser.wait, "return document.querySelector('#timeline .row[data-seq=\"1\"]')")
        at = "2026-01-01T00:00:00Z"
        bad: list[dict[str, Any]] = [
               {"type": "conflict", "actor": "mallory", "timestamp": at, "data": {"conflicts": "no list", "seq": "x"}},
               {"type": "conflict", "actor": "mallory", "timestamp": at,
                "data": {"conflicts": [None, 5, {"entityId": {"nested": 1}, "heldBy": "bob", "mode": "shared"}]}},
               {"type": "<img src=x onerror=window.__pwned=1>", "actor": "<b>mallory</b>", "timestamp": at,
                "changeInfo": {"entityIds": "fn:not-a-list"}, "stateTransition": "broken"},
               {"type": "modified", "actor": "alice", "timestamp": at}]
        for seq, event in enumerate(bad, start=2):
            await deliver(browser, "session.event", {"sessionId": sid, "seq": seq, "event": event})
        await run(browser.wait, "return document.querySelector('#timeline .row[data-seq=\"5\"]')")
        texts = [await run(browser.js, text_of(seq)) for seq in range(2, 6)]
        assert texts[0].endswith("malloryconflictseq x touched ")
        assert texts[1].endswith('malloryconflictseq ? touched null, 5 +1')
        assert "<img src=x onerror=window.__pwned=1>" in texts[2] and "<b>mallory</b>" in texts[2]
        assert texts[3].endswith("alicemodified")  # the rows after them are drawn as ever
        assert await run(browser.js, "return document.querySelectorAll('#timeline img, #timeline b').length") == 0
        assert await run(browser.js, "return window.__pwned === undefined")
        # The Handoff panel with a malformed conflict among its recent changes: every section is still drawn.
        handoff = await alice.call("bridge.handoff", {"sessionId": sid})
        handoff["recentChanges"] = [{"seq": 2, **bad[0]}, {"seq": 3, **bad[1]}, {"seq": 9, "type": "modified"}]
        handoff["kgContext"] = [None, {"entityId": "fn:parse", "related": "many"}]
        await run(browser.js, "window.__replies['bridge.handoff'] = arguments[0]", handoff)
        await run(browser.click, "button[data-tab='handoff']")
        advice = await run(browser.wait, "const a = document.querySelector('#advice'); return a && a.textContent")
        assert advice == handoff["joiningAdvice"]
        lines = await run(browser.js, "return [...document.querySelectorAll('#handoff .line')].map(l => l.textContent)")
        assert lines[:5] == ["#2 conflict seq x touched ", "#3 conflict seq ? touched null, 5 +1", "#9 modified ",
                             "null", "fn:parse related 0"]
        assert "TypeError" not in await run(browser.js, "return document.querySelector('#handoff').textContent")


async def select(browser: Browser, selector: str, value: str) -> None:
    """A scripted choice, as a keyboard choice is: a `change` event only."""
    await run(browser.js, "const s = document.querySelector(arguments[0]); s.value = arguments[1];"
                          "s.dispatchEvent(new Event('change'))", selector, value)


SHOWN = "return [...document.querySelectorAll('#sessions .row[data-session]')].map(r => r.dataset.session).sort()"


async def test_every_status_can_be_listed_and_a_suspension_keeps_the_row(site: str, daemon: Daemon,
                                                                         namespace: str, browser: Browser) -> None:
    async with rpc(daemon.port, token("alice", namespace)) as alice:
        for sid in ("s-live", "s-sus", "s-done"):
            await alice.call("session.create", {"sessionId": sid})
        await login(browser, site, "viewer", namespace)
        await run(browser.wait, f"return document.querySelector(\"{row('s-done')}\")")
        await alice.call("session.suspend", {"sessionId": "s-sus"})
        await alice.call("session.checkpoint", {"sessionId": "s-done", "final": True})
        await run(browser.wait, f"return document.querySelector(\"{row('s-sus')}\").dataset.status === 'suspended'")
        # Polls come and go (every 2 s): the suspended row stays, marked.
        await run(browser.wait, "return Number(document.querySelector('#chart').dataset.samples) >= 2", timeout=10)
        assert await run(browser.js, SHOWN) == ["s-done", "s-live", "s-sus"]
        assert "working · suspended" in await run(browser.js, f"return document.querySelector(\"{row('s-sus')}\")"
                                                                ".textContent")
        await select(browser, "#f-status", "suspended")
        await run(browser.wait, f"return JSON.stringify(({SHOWN.removeprefix('return ')})) === '[\"s-sus\"]'")
        assert await run(browser.js, "return document.querySelector('#count').textContent") == "1"
        await select(browser, "#f-status", "completed")
        await run(browser.wait, f"return JSON.stringify(({SHOWN.removeprefix('return ')})) === '[\"s-done\"]'")
        await select(browser, "#f-status", "")
        await select(browser, "#f-state", "completed")  # a state choice by `change` filters too
        await run(browser.wait, f"return JSON.stringify(({SHOWN.removeprefix('return ')})) === '[\"s-done\"]'")


async def test_a_transition_is_drawn_only_where_the_state_changed(site: str, daemon: Daemon,
                                                                  namespace: str, browser: Browser) -> None:
    async with rpc(daemon.port, token("alice", namespace)) as alice:
        sid = (await alice.call("session.create", {}))["sessionId"]
        for etype in ("test_pass", "broke", "broke", "test_pass", "test_pass"):  # seqs 1..5
            await alice.call("event.emit", {"sessionId": sid, "event": {"type": etype}})
        await login(browser, site, "viewer", namespace)
        await open_session(browser, sid)
        await run(browser.wait, "return document.querySelector('#timeline .row[data-seq=\"5\"]')")
        classes = await run(browser.js, "return [1, 2, 3, 4, 5].map(s => document.querySelector("
                                        "`#timeline .row[data-seq=\"${s}\"]`).className)")
    assert classes == ["row ev", "row ev transition broken", "row ev broken", "row ev transition", "row ev"]
