"""Coordination between agents: presence, entity leases with fencing tokens, conflict alerts, mailboxes, and
what reaches an agent's context: the answers of Claude Code's hooks (answers.py, hook_text.py), breaks and
fixes (outcomes.py), delivery receipts (receipts.py).

service.py (the coordination service over one daemon's Redis and graph), presence.py, leases.py
(acquire, renew, release, list, the reaper), parts.py (a large lease's writes in bounded calls),
coverage.py (what a lease on an entity covers, from the graph), intents.py (planned work and its
predicted overlaps), tasks.py (`task:<id>` claims), alerts.py (conflict alerts), mailbox.py, store.py
(loads coordination.lua and translates its errors).

Holds its own Redis Function library (coordination.lua, loaded beside the sessions library), the
services over it, their JSON-RPC methods (methods.py, declared in api/) and the steps that run around
other methods (steps.py: activity, presence, fencing, conflict alerts; docs/coordination.md). May import
the shared ground, `redisio/`, `sessions/` and `kg/`; `bridge/`, `api/`, `ws/`, `mcp/` and `server/` build on it.
"""
