"""Coordination between agents: presence, entity leases with fencing tokens, conflict alerts, mailboxes.

Holds its own Redis Function library (coordination.lua, loaded beside the sessions library), the
services over it and their JSON-RPC methods (docs/coordination.md). May import the shared ground,
`redisio/`, `sessions/` and `kg/`; `bridge/`, `ws/`, `mcp/` and `server/` build on it.
"""
