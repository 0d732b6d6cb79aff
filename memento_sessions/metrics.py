"""Every Prometheus metric of the daemon, declared in one place."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, Info

from memento_sessions import __version__

_FAST = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)

BUILD_INFO = Info("memento_build", "Build of this daemon")
BUILD_INFO.info({"version": __version__})

BACKEND_UP = Gauge("memento_backend_up", "1 while the backend answers", ["backend"])
BACKEND_ERRORS = Counter("memento_backend_errors_total", "Failed backend calls", ["backend"])
EMBEDDED_RESTARTS = Counter("memento_embedded_restarts_total", "Embedded server restarts", ["server"])

ACTIVE_SESSIONS = Gauge("memento_active_sessions", "Sessions in the index that have not expired")
EVENTS = Counter("memento_events_total", "Events stored", ["type"])
SESSION_LIMIT_REFUSALS = Counter("memento_session_limit_refusals_total", "Creates and emits refused at a bound "
                                 "(session_full, namespace_full)", ["reason"])
REPLY_PAGES = Counter("memento_reply_pages_total", "Replies cut to a page (count or bytes) with a next cursor",
                      ["method"])
REDIS_SPINS = Counter("memento_redis_spins_total",
                      "Writes on an idle hot-path connection after which the loop polled for the reply")
REDIS_SPIN_MISSES = Counter("memento_redis_spin_misses_total",
                            "Spins whose reply took longer than MEMENTO_REDIS_SPIN_US (the loop then slept)")
EMIT_SECONDS = Histogram("memento_emit_seconds", "Time to store and publish an emit", buckets=_FAST)
GC_PAUSE_SECONDS = Histogram("memento_gc_pause_seconds", "Pauses of Python's cyclic garbage collector",
                             ["generation"], buckets=_FAST)

WS_CONNECTIONS = Gauge("memento_ws_connections", "Open WebSocket connections")
WS_MESSAGES_SENT = Counter("memento_ws_messages_sent_total", "Frames sent to WebSocket clients")
WS_SLOW_CLOSES = Counter("memento_ws_slow_consumer_closes_total", "Connections closed as slow consumers")
WS_REFUSED = Counter("memento_ws_refused_total", "WebSocket handshakes, subscriptions and connections refused or "
                     "closed at a bound (max_connections, handshake_timeout, too_many_subscriptions, token_expired)",
                     ["reason"])

CHECKPOINTS = Counter("memento_checkpoints_total", "Checkpoints written", ["outcome"])
KG_ANCHORS_WRITTEN = Counter("memento_kg_anchors_written_total", "SessionAnchor links written to the KG")
CHECKPOINT_ENTITIES_SKIPPED = Counter("memento_checkpoint_entities_skipped_total",
                                      "Entities of checkpoint windows past MEMENTO_CHECKPOINT_MAX_ENTITIES: counted, "
                                      "not anchored")
FAILURE_SNAPSHOTS = Counter("memento_failure_snapshots_total", "Failure snapshots stored in Postgres")
SNAPSHOTS_DEFERRED = Counter("memento_snapshots_deferred_total",
                             "Failure snapshots Postgres could not take at once, kept in Redis until it does")
SNAPSHOTS_PENDING = Gauge("memento_snapshots_pending", "Failure snapshots waiting in Redis at the last flush pass")
KG_STUBS_PRUNED = Counter("memento_kg_stubs_pruned_total", "Stub CodebaseEntity nodes removed once nothing linked them")
BRIDGE_CACHE_BYTES = Gauge("memento_bridge_cache_bytes", "Bytes held by the bridge's breakage cache")
BRIDGE_CACHE_EVICTIONS = Counter("memento_bridge_cache_evictions_total",
                                 "Bridge cache entries dropped or refused to stay within its bounds")

BRIDGE_QUERY_SECONDS = Histogram(
    "memento_bridge_query_seconds", "Bridge query latency", ["query"], buckets=_FAST
)

MCP_SESSION_LIMIT = Counter("memento_mcp_session_limit_total",
                            "MCP sessions closed (oldest idle) or refused (none idle) at MEMENTO_MCP_MAX_SESSIONS",
                            ["action"])

LEASE_ACQUIRES = Counter("memento_lease_acquires_total", "lease.acquire calls (granted, refused for a conflict, or "
                         "lease_limit at MEMENTO_LEASE_MAX, lease_too_large past MEMENTO_LEASE_MAX_COVERED, "
                         "entity_holds past MEMENTO_LEASE_MAX_HOLDS)", ["result"])
PACED_SECONDS = Counter("memento_paced_seconds_total", "Seconds heavy work waited for its namespace's budget "
                        "(lease: MEMENTO_LEASE_PACE covered entities a second; batch, checkpoint: "
                        "MEMENTO_BATCH_IDS_PACE entity ids; copy: MEMENTO_STAGE_PACE_BYTES)", ["work"])
LEASE_ENDS = Counter("memento_lease_ends_total", "Leases ended (released, expired, orphaned)", ["reason"])
LEASE_CONFLICT_ALERTS = Counter("memento_lease_conflict_alerts_total",
                                "lease.conflict alerts sent to holders (each stored once in its mailbox)")
STALE_LEASE_REFUSALS = Counter("memento_stale_lease_refusals_total", "Emits refused for an old fencingToken")
MAILBOX_MESSAGES = Counter("memento_mailbox_messages_total", "Mailbox copies sent (stored, or a duplicate id)",
                           ["outcome"])
HOOK_ANSWERS = Counter("memento_hook_answers_total", "Hook inputs answered, or allowed unread: malformed, "
                       "unknown_event", ["outcome"])
MAILBOX_DROPPED = Counter("memento_mailbox_dropped_total", "Oldest messages dropped at MEMENTO_MAILBOX_MAX")
MAILBOX_REFUSED = Counter("memento_mailbox_refused_total",
                          "mailbox.send refused: mailbox_limit (MEMENTO_MAILBOXES_MAX), unknown_agent, id_taken",
                          ["reason"])

COMPACTIONS = Counter("memento_compactions_total", "Session compactions that removed events (manual or automatic)")
REHYDRATE_SECONDS = Histogram("memento_rehydrate_seconds", "Time to rebuild a session's view at a seq "
                              "(session.get atSeq: snapshot plus the events after it)", buckets=_FAST)
LIFECYCLE = Counter("memento_lifecycle_total", "Lifecycle moves (suspended, resumed, forked, cleared, "
                    "archived, kept) and refusals (suspend_failed, heavy_refused at MEMENTO_HEAVY_MAX)", ["action"])

# Usage (usage/): the model label is one of the first MEMENTO_USAGE_METRIC_MODELS models a daemon saw, else
# "other"; no label comes from client input beyond that bounded set.
USAGE_TOKENS = Counter("memento_usage_tokens_total", "Tokens the agents reported, by model, source (events, otel, "
                       "otel-metrics) and type (input, output, cache_read, cache_creation)",
                       ["model", "source", "type"])
USAGE_COST = Counter("memento_usage_cost_usd_total", "Cost in USD the agents' sources reported (none is guessed)",
                     ["model", "source"])
OTLP_REQUESTS = Counter("memento_otlp_requests_total", "OTLP/HTTP export requests by signal (logs, metrics) and "
                        "outcome (ok, bad_request, unauthorized, too_large, rate_limited, unsupported, unavailable, "
                        "failed)",
                        ["signal", "outcome"])
OTLP_RECORDS = Counter("memento_otlp_records_total", "OTLP log records and metric points taken (usage) or ignored "
                       "(another event or metric, no session.id, unknown_session, duplicate: a retried request)",
                       ["signal", "outcome"])

# Every label value the daemon can count, with a 0 sample from the start: a counter with no sample until its
# first increment reads as no data, so `increase(...)` and `rate(...)` over the first failure show nothing.
KNOWN_LABELS: dict[Counter, tuple[str | tuple[str, ...], ...]] = {
    BACKEND_ERRORS: ("redis", "falkordb", "postgres"),
    EMBEDDED_RESTARTS: ("redis", "postgres"),
    SESSION_LIMIT_REFUSALS: ("session_full", "namespace_full"),
    REPLY_PAGES: ("session.get", "session.list", "session.conversation", "bridge.isolate"),
    WS_REFUSED: ("max_connections", "handshake_timeout", "too_many_subscriptions", "token_expired"),
    CHECKPOINTS: ("working", "broken", "coordinating", "completed"),
    MCP_SESSION_LIMIT: ("closed", "refused"),
    LEASE_ACQUIRES: ("granted", "refused", "lease_limit", "lease_too_large", "entity_holds"),
    LEASE_ENDS: ("released", "expired", "orphaned"),
    PACED_SECONDS: ("lease", "batch", "checkpoint", "copy"),
    MAILBOX_MESSAGES: ("stored", "duplicate"),
    HOOK_ANSWERS: ("answered", "malformed", "unknown_event"),
    MAILBOX_REFUSED: ("mailbox_limit", "unknown_agent", "id_taken"),
    LIFECYCLE: ("suspended", "kept", "resumed", "cleared", "forked", "archived", "suspend_failed", "heavy_refused"),
    # a counter of several labels: every combination (usage: "other" stands for models not seen yet)
    USAGE_TOKENS: tuple(("other", source, kind) for source in ("events", "otel", "otel-metrics")
                        for kind in ("input", "output", "cache_read", "cache_creation")),
    USAGE_COST: tuple(("other", source) for source in ("events", "otel", "otel-metrics")),
    OTLP_REQUESTS: tuple((signal, outcome) for signal in ("logs", "metrics") for outcome in (
        "ok", "bad_request", "unauthorized", "too_large", "rate_limited", "unsupported", "unavailable", "failed")),
    OTLP_RECORDS: tuple((signal, outcome) for signal in ("logs", "metrics")
                        for outcome in ("taken", "not_usage", "too_many_sessions", "unknown_session", "duplicate")),
}
for _counter, _values in KNOWN_LABELS.items():
    for _value in _values:
        _counter.labels(*((_value,) if isinstance(_value, str) else _value))
