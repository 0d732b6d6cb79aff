"""The daemon: one anyio task group that starts the backends, builds the services and serves one HTTP port.

daemon.py (start-up, SIGTERM, shutdown), services.py (the services and the RPC registry, built once),
app.py (the routes: /ws, /mcp, /metrics, /healthz, /readyz, the dashboard), health.py (backend probes
behind /readyz), check.py (`memento-sessions check`), handshake.py (the HTTP protocol's handshake hooks), stdio.py
(`memento-sessions mcp`: the services in a process of their own, their tools on stdio).

The top of the package (only cli.py sits above it): it may import every other package; nothing but
cli.py imports it.
"""
