"""The daemon: one anyio task group that starts the backends, builds the services and serves one HTTP port.

daemon.py (start-up, SIGTERM, shutdown), services.py (the services and the RPC registry, built once),
app.py (the routes: /ws, /mcp, /metrics, /healthz, /readyz, the dashboard), health.py (backend probes
behind /readyz), check.py (`memento-sessions check`), handshake.py (the HTTP protocol's handshake hooks), stdio.py
(`memento-sessions mcp`: the services in a process of their own, their tools on stdio), hooks.py
(`POST /hooks/claude-code` and `/hooks/gemini-cli`), keepalive.py (WebSocket keepalive for every
connection from one task), websocket.py (uvicorn's sansio WebSocket protocol, keeping less per connection).

Near the top of the package (only cli/ sits above it): it may import every other package; nothing but
cli/ imports it.
"""
