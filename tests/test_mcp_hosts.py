"""/mcp behind a remapped port (`docker run -p 8766:8765`, compose's 8766-8768): the daemon's loopback names
are accepted on any port; other names only as configured (MEMENTO_MCP_ALLOWED_HOSTS)."""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest

from memento_sessions.embedded.process import free_port
from memento_sessions.endpoints import Endpoints
from memento_sessions.server.daemon import running
from tests.helpers import make_settings, token

pytestmark = pytest.mark.anyio

HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}


async def test_loopback_names_are_served_on_any_port_other_names_get_421(backend_urls: Endpoints,
                                                                          tmp_path: Path) -> None:
    port = free_port()  # a fixed port, as in a container: MEMENTO_PORT=8765 published elsewhere
    settings = make_settings(backend_urls, tmp_path, port=port, mcp_allowed_hosts="memento.example.com")
    async with running(settings) as daemon, httpx2.AsyncClient(timeout=30) as http:
        assert daemon.port == port
        url = f"http://127.0.0.1:{port}/mcp"
        good = {**HEADERS, "authorization": f"Bearer {token('host-agent')}"}

        async def status(**headers: str) -> int:
            return (await http.post(url, json=INIT, headers={**good, **headers})).status_code

        for published in (f"127.0.0.1:{port}", "127.0.0.1:8766", "localhost:8768", "[::1]:18765", "localhost"):
            assert await status(host=published) == 200, published
        assert await status(host="localhost:8766", origin="http://localhost:8766") == 200
        assert await status(host="memento.example.com") == 200
        assert await status(host="memento.example.com:8766") == 421, "other names: exactly as configured"
        assert await status(host="evil.example:8766") == 421
        assert await status(host="localhost.evil.example:8766") == 421
        assert await status(host="localhost:8766", origin="http://evil.example") == 403
