"""The WebSocket transport of `/ws`: from a client's frame to rpc.py, and from fan-out back to the client.

gateway.py (the ASGI endpoint: handshake auth, the reader, dispatch), connection.py (one client's
bounded send buffer and its writer), frames.py (frames written straight to the transport),
subscriptions.py (`session.subscribe` replay-then-live, `sessions.watch`).

May import the shared ground (the package root), redisio/ and sessions/; not mcp/ (its sibling
transport) nor server/.
"""
