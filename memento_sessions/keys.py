"""Every Redis key and channel name, built here and nowhere else (a FalkorDB graph is a key too).

All keys of one session share the hash tag `{<sessionId>}`, so a session lives in one Cluster slot
and one Redis Function call may touch all of them; so does the session's pub/sub channel, which the
Functions SPUBLISH on a Redis Cluster (a shard channel must hash to the slot of the call's keys).
"""

from __future__ import annotations

from dataclasses import dataclass

PREFIX = "ms"


@dataclass(frozen=True, slots=True)
class SessionKeys:
    """The keys of one session, in the order the Redis Functions take them."""

    session: str
    events: str
    agents: str
    ids: str

    def all(self) -> list[str]:
        """Every key, as passed to FCALL."""
        return [self.session, self.events, self.agents, self.ids]


def session_keys(ns: str, session_id: str) -> SessionKeys:
    """Keys of a session: hash, event ZSET, agent set, idempotency hash."""
    base = f"{PREFIX}:{ns}:{{{session_id}}}"
    return SessionKeys(f"{base}:session", f"{base}:events", f"{base}:agents", f"{base}:ids")


def session_index(ns: str) -> str:
    """ZSET of the namespace's session ids scored by creation time (ms): listing never scans."""
    return f"{PREFIX}:{ns}:index"


def namespaces() -> str:
    """SET of every namespace that has created a session (the janitor walks their indexes)."""
    return f"{PREFIX}:_system:namespaces"


def session_channel(ns: str, session_id: str) -> str:
    """Pub/sub channel of one session's events and checkpoints. It carries the session's hash tag: on a
    Redis Cluster the session's Functions SPUBLISH it from the session's own slot."""
    return f"{PREFIX}:{ns}:{{{session_id}}}:channel"


def sharded(channel: str) -> bool:
    """Whether `channel` is a session's (sharded on a Redis Cluster), not a namespace's or a daemon's."""
    return channel.endswith("}:channel")


def announce_channel(ns: str) -> str:
    """Pub/sub channel of the namespace's session announcements."""
    return f"{PREFIX}:{ns}:sessions"


def daemon_channel(daemon_id: str) -> str:
    """A channel only this daemon subscribes to: it keeps the pub/sub connection in subscribe mode."""
    return f"{PREFIX}:_system:daemon:{daemon_id}"


def checkpoint_lock(ns: str, session_id: str) -> str:
    """Lock held while one daemon checkpoints a session."""
    return f"{PREFIX}:{ns}:{{{session_id}}}:cplock"


def pending_snapshots(ns: str, session_id: str) -> str:
    """HASH of the session's failure snapshots Postgres has not taken yet (checkpoint id -> snapshot JSON)."""
    return f"{PREFIX}:{ns}:{{{session_id}}}:pending-snapshots"


def pending_snapshot_index() -> str:
    """ZSET of the sessions that have pending snapshots: a later daemon finds them without a SCAN."""
    return f"{PREFIX}:_system:pending-snapshots"


def retention_lease() -> str:
    """Lease held by the one daemon that runs the retention jobs."""
    return f"{PREFIX}:_system:retention-lease"


# The knowledge graph (kg/): one FalkorDB graph per namespace, named from MEMENTO_KG_GRAPH (`prefix`).


def graph_name(prefix: str, ns: str) -> str:
    """The KG graph of a namespace: `<prefix>` for default, else `<prefix>_<ns>`."""
    return prefix if ns == "default" else f"{prefix}_{ns}"


def graph_namespace(prefix: str, name: str) -> str | None:
    """The namespace whose graph `name` is (graph_name read back); None for a graph not under `prefix`."""
    if name == prefix:
        return "default"
    return name.removeprefix(prefix + "_") if name.startswith(prefix + "_") else None


# Coordination (coordination/, docs/coordination.md). A namespace's leases, roles and liveness share the
# hash tag `{<ns>/coord}` (one slot: an all-or-nothing acquire over many entities is one Function call);
# an agent's mailbox has `{<ns>/agent/<agentId>}`; a session's presence lives under the session's own tag.


@dataclass(frozen=True, slots=True)
class LeaseKeys:
    """The keys of a namespace's leases, in the order the coordination Functions take them."""

    leases: str
    holds: str
    expiry: str
    fence: str
    byagent: str
    alive: str
    covered: str
    counts: str
    xcounts: str

    def all(self) -> list[str]:
        """Every key, as passed to FCALL (`holds` is the prefix of the per-entity hold zsets)."""
        return [self.leases, self.holds, self.expiry, self.fence, self.byagent, self.alive, self.covered,
                self.counts, self.xcounts]

    def hold(self, mode: str, entity_id: str) -> str:
        """ZSET of an entity's holds of one mode (`<agentId>/<leaseId>/<via>` -> end in ms); the coordination
        Functions build the same name from `holds`."""
        return f"{self.holds}:{'x' if mode == 'exclusive' else 's'}:{entity_id}"


def coord_base(ns: str) -> str:
    """The prefix of a namespace's coordination keys, with their hash tag."""
    return f"{PREFIX}:{ns}:{{{ns}/coord}}"


def lease_keys(ns: str) -> LeaseKeys:
    """Leases (hash), the prefix of the holds of each entity (two zsets per entity), expiries (zset), fencing
    tokens (hash), `<agent>/<leaseId>` (zset), when each agent was last seen (zset), what each lease covers
    (hash), and each entity's holds not yet removed, all and exclusive (two hashes)."""
    base = coord_base(ns)
    return LeaseKeys(f"{base}:leases", f"{base}:holds", f"{base}:expiry", f"{base}:fence", f"{base}:byagent",
                     f"{base}:alive", f"{base}:covered", f"{base}:counts", f"{base}:xcounts")


def role_members(ns: str, role: str) -> str:
    """SET of the agents whose token grants `role`."""
    return f"{coord_base(ns)}:role:{role}"


def agent_roles(ns: str) -> str:
    """HASH agentId -> the roles it declared (presence.set), comma-separated."""
    return f"{coord_base(ns)}:roles"


def coord_namespaces() -> str:
    """SET of the namespaces that hold leases: every daemon's reaper walks them."""
    return f"{PREFIX}:_system:coord-namespaces"


def mailbox_keys(ns: str, agent_id: str) -> tuple[str, str, str]:
    """An agent's mailbox: order (zset messageId -> seq), messages (hash), acked (set)."""
    base = f"{PREFIX}:{ns}:{{{ns}/agent/{agent_id}}}"
    return f"{base}:inbox", f"{base}:messages", f"{base}:acked"


def surfaced_key(ns: str, agent_id: str) -> str:
    """STRING: the seq of the newest mailbox message surfaced to the agent's context (a hook's answer, an MCP
    tool's notices); in the mailbox's hash tag, so one Function call reads the mailbox and moves it."""
    return f"{PREFIX}:{ns}:{{{ns}/agent/{agent_id}}}:surfaced"


def hook_agents(ns: str) -> str:
    """ZSET `<agentId>|<sessionId>` -> ms of the agent's last hook call (written at its SessionStart, then at most
    every tenth of MEMENTO_PRESENCE_VISIT): who works in the namespace now."""
    return f"{coord_base(ns)}:hook-agents"


def token_roles(ns: str) -> str:
    """SET of the roles some token seen in the namespace grants: `presence.set` cannot claim them."""
    return f"{coord_base(ns)}:token-roles"


def declared_members(ns: str, role: str) -> str:
    """SET of the agents that declared `role` with presence.set (a role no token grants)."""
    return f"{coord_base(ns)}:declared:{role}"


def mail_keys(ns: str) -> tuple[str, str]:
    """A namespace's mail records, one tag `{<ns>/mail}`: its mailboxes (zset agentId -> the unix second its
    newest message expires) and the agents seen in it (zset agentId -> unix second last seen)."""
    base = f"{PREFIX}:{ns}:{{{ns}/mail}}"
    return f"{base}:boxes", f"{base}:known"


def mail_body(ns: str, message_id: str) -> str:
    """STRING: one sent message's sender, subject and body, stored once however many mailboxes hold it."""
    return f"{PREFIX}:{ns}:{{{ns}/mail}}:body:{message_id}"


def mail_receipts(ns: str, message_id: str) -> str:
    """HASH of one sent message's receipts: `<agentId>|<stage>` -> ISO time (stage: stored, pushed, surfaced,
    acked), and `#channel`, the sender's channel their changes are pushed on. Beside the message's body."""
    return f"{PREFIX}:{ns}:{{{ns}/mail}}:receipts:{message_id}"


def presence_key(ns: str, session_id: str) -> str:
    """HASH `<agentId>/<daemonId>` -> the agent's connections on that daemon, last request, heartbeat."""
    return f"{PREFIX}:{ns}:{{{session_id}}}:presence"


def agent_channel(ns: str, agent_id: str) -> str:
    """Pub/sub channel of one agent's mailbox messages and lease conflicts."""
    return f"{PREFIX}:{ns}:agent:{agent_id}"


# Usage (usage/, docs/usage.md): a session's under the session's own tag (one Function call folds a batch into
# its runs and totals); an agent's under `{<ns>/usage/<agentId>}`, the namespace's under `{<ns>/usage}`.


@dataclass(frozen=True, slots=True)
class UsageKeys:
    """The usage keys of one session, in the order `mu_fold` (usage/library.py) takes them after the session's
    own hash."""

    totals: str
    runs: str
    order: str
    starts: str
    series: str
    agents: str
    seen: str

    def all(self) -> list[str]:
        """Every key, as passed to the script."""
        return [self.totals, self.runs, self.order, self.starts, self.series, self.agents, self.seen]


def usage_keys(ns: str, session_id: str) -> UsageKeys:
    """A session's usage: totals HASH, runs HASH (run id -> row), order ZSET (by start ms), starts ZSET (by
    seq), series HASH (the cumulative metric points last seen), agents HASH (each agent's share of the totals,
    `<agentId> <source>:<field>`), seen ZSET (OTLP requests folded lately, by time: a retry folds nothing)."""
    base = f"{PREFIX}:{ns}:{{{session_id}}}:usage"
    return UsageKeys(f"{base}", f"{base}:runs", f"{base}:order", f"{base}:starts", f"{base}:series",
                     f"{base}:agents", f"{base}:seen")


def agent_usage_keys(ns: str, agent_id: str) -> tuple[str, str]:
    """An agent's usage: totals HASH, runs ZSET (`<sessionId> <runId>` by start ms)."""
    base = f"{PREFIX}:{ns}:{{{ns}/usage/{agent_id}}}"
    return f"{base}:usage", f"{base}:usage-runs"


def namespace_usage(ns: str) -> str:
    """HASH of the namespace's usage totals."""
    return f"{PREFIX}:{ns}:{{{ns}/usage}}:usage"


def commit_keys(ns: str) -> tuple[str, str, str]:
    """A namespace's commits, one tag `{<ns>/commits}`: HASH sha -> the session that produced it, ZSET of the
    shas by lexical order (a short sha's prefix read), ZSET sha -> when noted (the oldest dropped first)."""
    base = f"{PREFIX}:{ns}:{{{ns}/commits}}"
    return f"{base}:records", f"{base}:bysha", f"{base}:bytime"
