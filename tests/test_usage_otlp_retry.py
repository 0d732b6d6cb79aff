"""An OTLP exporter's retry of a request already folded (its reply lost, or a 503 after some sessions were
written) counts nothing again: a session remembers the requests it folded for MEMENTO_OTLP_DEDUPE_WINDOW
seconds, at most MEMENTO_OTLP_DEDUPE_REQUESTS of them. Against the real daemon and Redis."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from memento_sessions.endpoints import Endpoints
from memento_sessions.server.daemon import Daemon, running
from tests.helpers import make_settings, sample, token
from tests.test_usage_otlp import AGENT, JSON, LOGS, PROTOBUF, SESSION, hook_session, post, protobuf_logs, usage

pytestmark = pytest.mark.anyio
DUPLICATE = {"signal": "logs", "outcome": "duplicate"}


async def test_a_retried_request_is_folded_once(daemon: Daemon, namespace: str) -> None:
    await anyio.to_thread.run_sync(hook_session, daemon, namespace)
    tok, body = token("claude", namespace), protobuf_logs()
    assert (await post(daemon, "logs", body, PROTOBUF, tok)).status_code == 200
    once = await usage(daemon, namespace, sessionId=SESSION)
    agent_once, spend_once = await usage(daemon, namespace, agentId=AGENT), await usage(daemon, namespace)
    assert once["totals"]["source"] == "otel" and once["totals"]["inputTokens"] > 0
    before = sample("memento_otlp_records_total", DUPLICATE)
    statuses: list[int] = []

    async def retry() -> None:
        statuses.append((await post(daemon, "logs", body, PROTOBUF, tok)).status_code)

    async with anyio.create_task_group() as tg:  # retries, some of them at the same time
        for _ in range(4):
            tg.start_soon(retry)
    assert statuses == [200] * 4  # the exporter is told it is done: it stops retrying
    assert await usage(daemon, namespace, sessionId=SESSION) == once
    assert await usage(daemon, namespace, agentId=AGENT) == agent_once
    assert await usage(daemon, namespace) == spend_once
    assert sample("memento_otlp_records_total", DUPLICATE) - before >= 4


async def test_requests_are_remembered_for_a_bounded_time_and_number(backend_urls: Endpoints, tmp_path: Path,
                                                                    namespace: str) -> None:
    settings = make_settings(backend_urls, tmp_path, otlp_dedupe_window=2, otlp_dedupe_requests=1)
    async with running(settings) as daemon:
        await anyio.to_thread.run_sync(hook_session, daemon, namespace)
        tok, first, other = token("claude", namespace), protobuf_logs(), LOGS.read_bytes()

        async def input_tokens_after(body: bytes, headers: dict[str, str]) -> int:
            assert (await post(daemon, "logs", body, headers, tok)).status_code == 200
            return int((await usage(daemon, namespace, sessionId=SESSION))["totals"]["inputTokens"])

        single = await input_tokens_after(first, PROTOBUF)
        assert await input_tokens_after(first, PROTOBUF) == single  # a retry
        # The same records as JSON are another request (other bytes); it pushes the first out of a memory of one.
        assert await input_tokens_after(other, JSON) == 2 * single
        assert await input_tokens_after(first, PROTOBUF) == 3 * single
        assert await input_tokens_after(first, PROTOBUF) == 3 * single
        await anyio.sleep(2.5)  # past the window: remembered no more
        assert await input_tokens_after(first, PROTOBUF) == 4 * single
