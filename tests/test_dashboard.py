"""The live dashboard at `/`, driven in a real headless Chromium against an in-process daemon.

Until the daemon's app mounts the dashboard's routes, `site` serves them beside the daemon's own gateway
(the same `/ws` object the daemon serves); once mounted, `site` is the daemon's own port.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from memento_sessions.dashboard import CSP, routes
from memento_sessions.server.daemon import Daemon
from tests.browser import Browser, require_browser, run
from tests.helpers import token
from tests.rpcsocket import RpcSocket, rpc

pytestmark = pytest.mark.anyio
IMAGES = Path(__file__).resolve().parent.parent / "docs" / "images"
ATTEMPTS = 3  # timing windows a host-bound latency test measures before it fails


def fetch(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """A plain HTTP GET: status, headers, body (no redirects followed)."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


async def dashboard_mounted(port: int) -> bool:
    status, _, body = await anyio.to_thread.run_sync(fetch, f"http://127.0.0.1:{port}/")
    return status == 200 and b"/dashboard/app.js" in body


@pytest.fixture
async def site(daemon: Daemon) -> AsyncIterator[str]:
    """The base URL serving the dashboard and the daemon's /ws on one origin."""
    if await dashboard_mounted(daemon.port):
        yield f"http://127.0.0.1:{daemon.port}"
        return
    gateway = daemon.gateway
    assert gateway is not None

    async def healthz(_: Request) -> Response:
        return JSONResponse({"status": "ok"})

    pages = Starlette(routes=[*routes(), Route("/healthz", healthz)])

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket" and scope["path"] == "/ws":
            await gateway(scope, receive, send)
        else:
            await pages(scope, receive, send)

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, lifespan="off", log_config=None, ws="websockets-sansio", access_log=False)
    server = uvicorn.Server(config)
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve, [sock])
        while not server.started:
            await anyio.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
        server.should_exit = True


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    require_browser()
    opened: Browser = await run(Browser)
    try:
        yield opened
    finally:
        await run(opened.quit)


async def login(browser: Browser, site: str, agent: str, namespace: str) -> str:
    """Open the page with ?token= and wait for the live connection; the token used."""
    given = token(agent, namespace)
    await run(browser.get, f"{site}/?token={given}")
    await run(browser.wait, "return document.querySelector('#conn').dataset.state === 'live'")
    return given


TIME_OF = "return document.querySelector(`#timeline .row[data-seq=\"${arguments[0]}\"] .time`).textContent"


async def stage_activity(browser: Browser, peer: RpcSocket, session_ids: list[str] | None = None) -> None:
    """For the docs' screenshots only: events over a few polls, so the activity chart shows a rate, not a flat line.

    Every presence line waits for its counts too (a live join is shown at once, its counts a read later).
    """
    if os.environ.get("MEMENTO_SCREENSHOTS") != "1":
        return
    targets = session_ids or [(await peer.call("session.create", {}))["sessionId"]]
    deadline = time.monotonic() + 7
    for n in range(1000):
        if time.monotonic() > deadline:
            break
        count = 5 + (n * 7) % 23  # an uneven rate draws a line worth looking at
        batch = [{"type": "modified"}] * count
        await peer.call("event.emitBatch", {"sessionId": targets[n % len(targets)], "events": batch})
        await anyio.sleep(0.1)
    await run(browser.wait, "return Number(document.querySelector('#chart').dataset.samples) >= 3", timeout=10)
    await run(browser.wait, "return [...document.querySelectorAll('#presence .line[data-agent]')]"
                            ".every(l => l.textContent.includes('conn'))")


def row(session_id: str) -> str:
    return f"#sessions .row[data-session='{session_id}']"


async def open_session(browser: Browser, session_id: str) -> None:
    """Click a session's row once the list shows it."""
    await run(browser.wait, f"return document.querySelector(\"{row(session_id)}\")", timeout=20)
    await run(browser.click, row(session_id))


# ------------------------------------------------------------------ HTTP, no browser


async def test_page_and_assets_are_served_with_a_strict_policy(site: str) -> None:
    status, headers, body = await anyio.to_thread.run_sync(fetch, f"{site}/")
    assert status == 200 and headers["content-type"] == "text/html; charset=utf-8"
    assert headers["content-security-policy"] == CSP
    assert CSP.startswith("default-src 'self'; connect-src 'self' ws: wss:;")
    assert headers["cache-control"] == "no-cache" and headers["referrer-policy"] == "no-referrer"
    assert b'src="/dashboard/app.js"' in body and b"http" not in body.replace(b'http-equiv', b"")
    status, headers, js = await anyio.to_thread.run_sync(fetch, f"{site}/dashboard/app.js")
    assert status == 200 and headers["content-type"] == "text/javascript; charset=utf-8"
    assert b"https://" not in js and b"http://" not in js  # nothing loaded from elsewhere
    status, _, _ = await anyio.to_thread.run_sync(fetch, f"{site}/dashboard/app.js", {"If-None-Match": headers["etag"]})
    assert status == 304
    for name in ("../__init__.py", "__init__.py", "nope.js"):
        status, _, _ = await anyio.to_thread.run_sync(fetch, f"{site}/dashboard/{name}")
        assert status == 404, name


# ------------------------------------------------------------------ in the browser


async def test_live_sessions_events_broken_and_handoff(site: str, daemon: Daemon, namespace: str,
                                                      browser: Browser) -> None:
    given = await login(browser, site, "viewer", namespace)
    # The token left the URL at once and lives in this tab's sessionStorage only.
    assert await run(browser.js, "return location.href") == f"{site}/"
    assert await run(browser.js, "return sessionStorage.getItem('memento.token')") == given
    async with rpc(daemon.port, token("alice", namespace)) as alice:
        sid = (await alice.call("session.create", {"entityIds": ["fn:parse"]}))["sessionId"]
        await open_session(browser, sid)
        await run(browser.wait, "return document.querySelector('#timeline .row[data-seq=\"1\"]')")
        for i in range(2, 7):
            await alice.call("event.emit", {"sessionId": sid, "event": {"type": "modified", "changeInfo": {
                "elementType": "function", "entityIds": [f"fn:f{i}"], "operation": "modified"}}})
        await run(browser.wait, "return document.querySelector('#timeline .row[data-seq=\"6\"]')")
        seqs = await run(browser.js, "return [...document.querySelectorAll('#timeline .row[data-seq]')]"
                                     ".sort((a, b) => a.getBoundingClientRect().top - b.getBoundingClientRect().top)"
                                     ".map(r => [Number(r.dataset.seq), r.dataset.type])")
        assert seqs == [[1, "start"], [2, "modified"], [3, "modified"], [4, "modified"], [5, "modified"],
                        [6, "modified"]]
        async with rpc(daemon.port, token("bob", namespace)) as bob:
            # bob joins and holds fn:parse; alice's edit of it is a conflict (seq 7, its alert event seq 8).
            await bob.call("session.join", {"sessionId": sid})
            await alice.call("session.join", {"sessionId": sid})
            lease = await bob.call("lease.acquire", {"entityIds": ["fn:parse"], "ttl": 600})
            await alice.call("event.emit", {"sessionId": sid, "event": {"type": "modified", "changeInfo": {
                "elementType": "function", "entityIds": ["fn:parse"], "operation": "modified"}}})
            await alice.call("event.emit", {"sessionId": sid, "event": {"type": "broke", "impact": {
                "severity": "high", "testsFailed": ["t1"]}, "stateTransition": {"from": "working", "to": "broken"}}})
            await run(browser.wait, f"return document.querySelector(\"{row(sid)}\").dataset.state === 'broken'")
            assert await run(browser.js, "return document.querySelector('#d-state').textContent") == "broken"
            assert await run(browser.js, "return document.querySelector('#timeline .row[data-seq=\"9\"]')"
                                         ".className") == "row ev transition broken"
            assert await run(browser.js, "return document.querySelector('#timeline .row[data-seq=\"8\"]')"
                                         ".textContent") == \
                f"8{await run(browser.js, TIME_OF, 8)}aliceconflictseq 7 touched fn:parse held by bob (exclusive)"
            assert await run(browser.js, "return document.querySelector('#timeline .row[data-seq=\"8\"]')"
                                         ".className") == "row ev conflict"
            assert await run(browser.js, "return document.querySelector('#timeline .row[data-seq=\"7\"]')"
                                         ".className") == "row ev conflicted"
            await run(browser.wait, "return document.querySelector('#leases .line[data-agent=\"bob\"]')")
            assert await run(browser.js, "return document.querySelector('#leases .line').dataset.lease") \
                == lease["leaseId"]
            await run(browser.wait, "return document.querySelectorAll('#presence .line[data-agent]').length === 3")
            await stage_activity(browser, alice)
            await run(browser.screenshot, IMAGES / "dashboard-session.png")
            await run(browser.click, "button[data-tab='handoff']")
            advice = await run(browser.wait, "const a = document.querySelector('#advice'); return a && a.textContent")
            handoff = await alice.call("bridge.handoff", {"sessionId": sid})
            assert advice == handoff["joiningAdvice"] and advice.startswith("Broken at seq 9")
            # bob's lease on fn:parse is shown; bob is in the session, so it is no open conflict.
            assert [h["heldBy"] for h in handoff["leases"]] == ["bob"] and handoff["openConflicts"] == []
            assert await run(browser.js, "return [...document.querySelectorAll('#handoff-leases .line')]"
                                         ".map(l => [l.dataset.lease, l.textContent])") == \
                [[lease["leaseId"], "fn:parse exclusive bob"]]
            assert await run(browser.js, "return document.querySelector('#handoff-conflicts').textContent") \
                == "no open conflicts"
            await run(browser.screenshot, IMAGES / "dashboard-handoff.png")


async def test_methods_the_daemon_lacks_show_not_available(site: str, daemon: Daemon, namespace: str,
                                                          browser: Browser) -> None:
    assert daemon.services is not None
    methods = daemon.services.registry.methods
    async with rpc(daemon.port, token("alice", namespace)) as alice:
        sid = (await alice.call("session.create", {}))["sessionId"]
        await login(browser, site, "viewer", namespace)
        await open_session(browser, sid)
        for box, method in (("#presence", "presence.get"), ("#leases", "lease.list")):
            text = await run(browser.wait, f"const t = document.querySelector('{box}').textContent;"
                                           "return t !== 'loading…' && t")
            if method in methods:
                assert "not available" not in text, (method, text)
            else:
                assert text == "not available on this daemon", (method, text)
        await run(browser.click, "button[data-tab='conversation']")
        text = await run(browser.wait, "const t = document.querySelector('#conversation').textContent;"
                                       "return t !== 'loading…' && t")
        assert ("session.conversation" in methods) != (text == "not available on this daemon"), text


PRESENCE = ("return [...document.querySelectorAll('#presence .line[data-agent]')]"
            ".map(l => [l.dataset.agent, l.dataset.status])")


async def test_presence_shows_who_is_in_the_session_and_follows_joins_and_leaves(
        site: str, daemon: Daemon, namespace: str, browser: Browser) -> None:
    async with rpc(daemon.port, token("alice", namespace)) as alice, rpc(daemon.port, token("bob", namespace)) as bob:
        sid = (await alice.call("session.create", {}))["sessionId"]
        await alice.call("session.join", {"sessionId": sid})
        await login(browser, site, "viewer", namespace)
        await open_session(browser, sid)
        # The viewer's own subscription makes it present too.
        await run(browser.wait, PRESENCE + ".length === 2")
        assert await run(browser.js, PRESENCE) == [["alice", "active"], ["viewer", "active"]]
        assert "1 conn" in await run(browser.js, "return document.querySelector('#presence .line').textContent")
        await bob.call("session.join", {"sessionId": sid})
        await run(browser.wait, PRESENCE + ".length === 3")
        assert await run(browser.js, PRESENCE) == [["alice", "active"], ["bob", "active"], ["viewer", "active"]]
        # Shown at once from the notification; the read that follows fills in bob's connections.
        await run(browser.wait, "return document.querySelectorAll('#presence .line')[1].textContent.includes('1 conn')")
        await alice.call("session.leave", {"sessionId": sid})
        await run(browser.wait, PRESENCE + ".length === 2")
        assert await run(browser.js, PRESENCE) == [["bob", "active"], ["viewer", "active"]]


LEASES = ("return [...document.querySelectorAll('#leases .line[data-lease]')]"
          ".map(l => [l.dataset.lease, l.dataset.agent])")


async def test_leases_on_the_sessions_entities_show_and_new_ones_appear(
        site: str, daemon: Daemon, namespace: str, browser: Browser) -> None:
    async with rpc(daemon.port, token("alice", namespace)) as alice, rpc(daemon.port, token("bob", namespace)) as bob:
        sid = (await alice.call("session.create", {"entityIds": ["fn:parse"]}))["sessionId"]
        held = (await bob.call("lease.acquire", {"entityIds": ["fn:parse"], "ttl": 600}))["leaseId"]
        await bob.call("lease.acquire", {"entityIds": ["fn:elsewhere"], "ttl": 600})  # not this session's
        await login(browser, site, "viewer", namespace)
        await open_session(browser, sid)
        await run(browser.wait, LEASES + ".length === 1")
        assert await run(browser.js, LEASES) == [[held, "bob"]]
        line = await run(browser.js, "return document.querySelector('#leases .line').textContent")
        assert line.startswith("fn:parse exclusive bob until "), line
        # A lease taken for the session (on an entity it never named) shows at the next poll.
        shared = (await alice.call("lease.acquire", {"entityIds": ["fn:other"], "ttl": 600, "mode": "shared",
                                                     "sessionId": sid}))["leaseId"]
        await run(browser.wait, LEASES + ".length === 2")
        assert sorted(await run(browser.js, LEASES)) == sorted([[held, "bob"], [shared, "alice"]])
        await bob.call("lease.release", {"leaseId": held})
        await run(browser.wait, LEASES + ".length === 1")
        assert await run(browser.js, LEASES) == [[shared, "alice"]]


async def test_an_ingested_conversation_shows_its_blocks(site: str, daemon: Daemon, namespace: str,
                                                        browser: Browser) -> None:
    blocks = [
        {"id": "u1", "kind": "user_message", "status": "complete", "content": "Fix the parser"},
        {"id": "m1:0", "kind": "assistant_text", "status": "complete", "content": "Looking at parse()"},
        {"id": "toolu_1", "kind": "tool_use", "status": "pending", "toolName": "Read", "input": {"path": "p.py"}},
        {"id": "toolu_1", "kind": "tool_use", "status": "complete", "output": "def parse(): ..."},
    ]
    async with rpc(daemon.port, token("alice", namespace)) as alice:
        sid = (await alice.call("session.create", {}))["sessionId"]
        await alice.call("event.emitBatch", {"sessionId": sid, "events": [
            {"id": f"b{i}", "type": "block:upsert", "data": {"block": block}} for i, block in enumerate(blocks)]})
        await login(browser, site, "viewer", namespace)
        await open_session(browser, sid)
        await run(browser.click, "button[data-tab='conversation']")
        await run(browser.wait, "return document.querySelectorAll('#conversation .line[data-block]').length === 3")
        shown = await run(browser.js, "return [...document.querySelectorAll('#conversation .line[data-block]')]"
                                      ".map(l => [l.dataset.block, l.dataset.kind, l.dataset.status, l.textContent])")
        assert shown == [
            ["u1", "user_message", "complete", "user_message Fix the parser"],
            ["m1:0", "assistant_text", "complete", "assistant_text Looking at parse()"],
            ["toolu_1", "tool_use", "complete", 'tool_use Read({"path":"p.py"}) → def parse(): ...'],
        ]
        assert await run(browser.js, "return document.querySelector('#conversation > span').textContent") \
            == "3 blocks"


async def test_a_long_conversation_pages_and_shows_its_subagent_threads(site: str, daemon: Daemon, namespace: str,
                                                                      browser: Browser) -> None:
    """250 main blocks: the first page (200) with "more", which appends the rest; a subagent's thread by its
    button, with its own blocks only."""
    main = [{"id": f"u{i}", "type": "block:upsert", "data": {"block": {
        "id": f"m{i}", "kind": "user_message", "status": "complete", "content": f"prompt {i}"}}} for i in range(250)]
    sub = [{"id": "s0", "type": "subagent:spawned", "data": {"subagentId": "sub-1", "subagentType": "Explore"}},
           *({"id": f"s{i}", "type": "block:upsert", "data": {"subagentId": "sub-1", "block": {
               "id": f"x{i}", "kind": "assistant_text", "status": "complete", "content": f"found {i}"}}}
             for i in (1, 2)),
           {"id": "s3", "type": "subagent:completed", "data": {"subagentId": "sub-1", "status": "completed"}}]
    async with rpc(daemon.port, token("alice", namespace)) as alice:
        sid = (await alice.call("session.create", {}))["sessionId"]
        await alice.call("event.emitBatch", {"sessionId": sid, "events": main + sub})
        await login(browser, site, "viewer", namespace)
        await open_session(browser, sid)
        await run(browser.click, "button[data-tab='conversation']")
        await run(browser.wait, "return document.querySelectorAll('#conversation .line[data-block]').length === 200")
        assert await run(browser.js, "return document.querySelector('#conversation > span').textContent") \
            == "250 blocks · 1 subagents · first 200 shown"
        assert await run(browser.js, "return [...document.querySelectorAll('#conversation .threads button')]"
                                     ".map(b => [b.dataset.thread, b.textContent, b.className])") == \
            [["main", "main", "on"], ["sub-1", "Explore (completed, 2 blocks)", ""]]
        await run(browser.click, "#conversation > button")
        await run(browser.wait, "return document.querySelectorAll('#conversation .line[data-block]').length === 250")
        assert await run(browser.js, "return document.querySelector('#conversation .line[data-block]:last-child')"
                                     ".dataset.block") == "m249"
        assert await run(browser.js, "return document.querySelector('#conversation > button')") is None
        await run(browser.click, "#conversation .threads button[data-thread='sub-1']")
        await run(browser.wait, "return document.querySelectorAll('#conversation .line[data-block]').length === 2")
        assert await run(browser.js, "return [...document.querySelectorAll('#conversation .line[data-block]')]"
                                     ".map(l => l.textContent)") == ["assistant_text found 1", "assistant_text found 2"]
        assert await run(browser.js, "return document.querySelector('#conversation > span').textContent") \
            == "2 blocks · subagent sub-1 · 1 subagents"


async def test_a_bad_token_is_refused_clearly(site: str, browser: Browser) -> None:
    await run(browser.get, f"{site}/?token=not-a-token")
    message = await run(browser.wait, "return document.querySelector('#login-msg').textContent")
    assert message == "Token refused by the daemon (HTTP 401): check it and try again."
    assert await run(browser.js, "return sessionStorage.getItem('memento.token')") is None
    assert await run(browser.js, "return location.search") == ""
    assert await run(browser.js, "return document.querySelector('#login').hidden") is False
    await run(browser.screenshot, IMAGES / "dashboard-token-refused.png")


async def test_reconnects_with_a_banner_and_resumes_by_seq(site: str, daemon: Daemon, namespace: str,
                                                          browser: Browser) -> None:
    async with rpc(daemon.port, token("alice", namespace)) as alice:
        sid = (await alice.call("session.create", {"entityIds": ["fn:a"]}))["sessionId"]
        await login(browser, site, "viewer", namespace)
        await open_session(browser, sid)
        await run(browser.wait, "return document.querySelector('#timeline .row[data-seq=\"1\"]')")
        # Cut the page's connection under it (as a proxy restart would), then emit while it is down.
        closed = cut_viewer(daemon)
        assert closed == 1
        await run(browser.wait, "return !document.querySelector('#banner').hidden && "
                                "document.querySelector('#banner').textContent")
        banner = await run(browser.js, "return document.querySelector('#banner').textContent")
        assert banner.startswith("Disconnected, reconnecting in ")
        for _ in range(3):
            await alice.call("event.emit", {"sessionId": sid, "event": {"type": "modified"}})
        await run(browser.wait, "return document.querySelector('#conn').dataset.state === 'live'", timeout=15)
        await run(browser.wait, "return document.querySelector('#timeline .row[data-seq=\"4\"]')")
        seqs = await run(browser.js, "return [...document.querySelectorAll('#timeline .row[data-seq]')]"
                                     ".map(r => Number(r.dataset.seq)).sort((a, b) => a - b)")
        assert seqs == [1, 2, 3, 4]  # each once: resumed after seq 1, nothing replayed twice
        assert await run(browser.js, "return document.querySelector('#banner').hidden") is True


async def test_a_burst_of_new_sessions_does_not_hold_back_the_poll(site: str, daemon: Daemon, namespace: str,
                                                                  browser: Browser) -> None:
    # Every creation is announced and brings the next poll forward; announcements closer together than that
    # must not postpone it again and again: the other sessions' seqs keep updating during the burst.
    async with rpc(daemon.port, token("alice", namespace)) as alice, rpc(daemon.port, token("bob", namespace)) as bob:
        sid = (await bob.call("session.create", {}))["sessionId"]
        await login(browser, site, "viewer", namespace)
        await run(browser.type, "#f-agent", "bob")  # bob's session stays on screen above alice's new ones
        await run(browser.wait, f"return document.querySelector(\"{row(sid)}\")")
        started = time.monotonic()
        while time.monotonic() - started < 4:
            await alice.call("session.create", {})
            await bob.call("event.emit", {"sessionId": sid, "event": {"type": "modified"}})
            await anyio.sleep(0.1)
        # Read while the burst has only just ended: the row shows a seq some poll during it read.
        shown = int(await run(browser.js, f"return document.querySelector(\"{row(sid)}\").dataset.seq"))
    assert shown >= 10, shown


def cut_viewer(daemon: Daemon) -> int:
    """Close the viewer's WebSocket from the daemon's side; the number of connections closed."""
    gateway: Any = daemon.gateway
    viewers = [c for c in list(getattr(gateway, "connections", [])) if c.identity.agent_id == "viewer"]
    for conn in viewers:
        conn.close(1012)
    return len(viewers)


# ------------------------------------------------------------------ speed


async def test_an_emitted_event_is_on_screen_within_100_ms(site: str, daemon: Daemon, namespace: str,
                                                         browser: Browser) -> None:
    """p99 of emit -> row in the DOM over 200 events under 100 ms. The browser, the daemon and Redis share two
    vCPUs with the rest of the host: a window in which the host takes the machine (seen in CI: p50 99 ms, six
    times the usual) is measured again, up to ATTEMPTS windows, each printed; a slow page fails all of them."""
    async with rpc(daemon.port, token("alice", namespace)) as alice:
        sid = (await alice.call("session.create", {"entityIds": ["fn:a"]}))["sessionId"]
        await login(browser, site, "viewer", namespace)
        await open_session(browser, sid)
        # Warm up first (JIT, first layouts, the socket's buffers) so the sample measures the steady path; the
        # warm-up events are not counted. Both clocks are this machine's wall clock (Python's and the page's).
        for _ in range(20):
            await alice.call("event.emit", {"sessionId": sid, "event": {"type": "modified"}})
        await run(browser.wait, "return document.querySelector('#timeline .row[data-seq=\"21\"]')")
        # Date.now() when the row enters the DOM (the frame that paints it), keyed by seq.
        await run(browser.js, """
            window.__seen = {};
            new MutationObserver((records) => {
              const now = Date.now();
              for (const r of records) for (const n of r.addedNodes)
                if (n.dataset && n.dataset.seq && !(n.dataset.seq in window.__seen)) window.__seen[n.dataset.seq] = now;
            }).observe(document.querySelector('#timeline'), {childList: true, subtree: true});
            return 0""")
        windows: list[tuple[float, float]] = []
        for _ in range(ATTEMPTS):
            sent: dict[int, float] = {}
            for _ in range(200):
                before = time.time() * 1000
                seq = (await alice.call("event.emit", {"sessionId": sid, "event": {"type": "modified"}}))["seq"]
                sent[seq] = before
                await anyio.sleep(0.02)
            last = max(sent)
            await run(browser.wait, f"return window.__seen['{last}'] !== undefined && "
                                    f"Object.keys(window.__seen).filter(k => Number(k) >= {min(sent)}).length >= 200")
            seen = await run(browser.js, "return window.__seen")
            latencies = sorted(seen[str(seq)] - at for seq, at in sent.items())
            assert len(latencies) == 200
            p50, p99 = statistics.median(latencies), latencies[int(len(latencies) * 0.99) - 1]
            print(f"\nemit -> row in the DOM over {len(latencies)} events: p50 {p50:.1f} ms, p99 {p99:.1f} ms, "
                  f"max {latencies[-1]:.1f} ms")
            windows.append((p50, p99))
            if p99 < 100:
                break
    assert min(p99 for _, p99 in windows) < 100, windows


async def bulk(peer: RpcSocket, sessions: int) -> list[str]:
    ids = []
    for _ in range(sessions):
        ids.append((await peer.call("session.create", {}))["sessionId"])
    return ids


async def test_a_thousand_sessions_and_a_ten_thousand_event_timeline_keep_a_fixed_dom(
        site: str, daemon: Daemon, namespace: str, browser: Browser) -> None:
    async with rpc(daemon.port, token("alice", namespace)) as alice:
        ids = await bulk(alice, 999)
        big = (await alice.call("session.create", {}))["sessionId"]
        for _ in range(20):
            await alice.call("event.emitBatch", {"sessionId": big, "events": [{"type": "modified"}] * 500})
        started = time.monotonic()
        await login(browser, site, "viewer", namespace)
        await run(browser.wait, "return document.querySelector('#count').textContent === '1000'", timeout=20)
        listed = time.monotonic() - started
        rows = await run(browser.js, "return document.querySelectorAll('#sessions .row').length")
        assert 10 <= rows <= 80, rows
        await open_session(browser, big)
        started = time.monotonic()
        await run(browser.wait, "return document.querySelector('#timeline .row[data-seq=\"10000\"]')", timeout=20)
        loaded = time.monotonic() - started
        rows = await run(browser.js, "return document.querySelectorAll('#timeline .row').length")
        assert 10 <= rows <= 80, rows
        # The page still answers at once (no long task holds the main thread).
        ticks = await run(browser.driver.execute_async_script, """
            const done = arguments[arguments.length - 1]; const t0 = performance.now();
            requestAnimationFrame(() => done(performance.now() - t0));""")
        print(f"\n1000 sessions listed in {listed:.2f} s; 10,000 events loaded in {loaded:.2f} s; "
              f"next frame after {ticks:.1f} ms; DOM rows {rows}")
        assert ticks < 100
        await alice.call("event.emit", {"sessionId": ids[-2], "event": {"type": "broke"}})
        await run(browser.wait, "return document.querySelector('#broken').textContent === '1'", timeout=10)
        await stage_activity(browser, alice, ids[:5])
        await run(browser.screenshot, IMAGES / "dashboard-sessions.png")
    assert json.dumps(ids)  # the ids were real strings
