"""Coordination between agents: presence, entity leases with fencing tokens, conflict alerts, mailboxes, and
what reaches an agent's context: the answers of Claude Code's hooks (answers.py, hook_text.py), breaks and
fixes (outcomes.py), delivery receipts (receipts.py).

Holds its own Redis Function library (coordination.lua, loaded beside the sessions library), the
services over it and their JSON-RPC methods (docs/coordination.md). May import the shared ground,
`redisio/`, `sessions/` and `kg/`; `bridge/`, `ws/`, `mcp/` and `server/` build on it.
"""
