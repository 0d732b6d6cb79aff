"""memento-sessions: a real-time coordination daemon for swarms of AI agents.

The package is laid out by stage; a package imports only from the ones before it in this order
(tests/test_layout.py checks it; docs/layout.md says why):

    the shared ground (this root: settings, errors, auth, keys, logs, metrics, rpc, limits, retry,
      backends, endpoints)
    <- ingest/            (pure converters and the conversation reducer: imports nothing of the package)
    <- redisio/, embedded/, client/, dashboard/, usage/
    <- sessions/          (live sessions: the Redis Function library and the SessionManager)
    <- history/           (event sourcing: time travel, diff, snapshots, compaction)
    <- lifecycle/         (suspend to Postgres and resume, fork, stored sessions read)
    <- kg/                (the knowledge graph in FalkorDB)
    <- checkpoints/, coordination/
    <- bridge/            (what broke where, what an agent did, handoffs)
    <- api/               (every JSON-RPC method declared once)
    <- ws/, mcp/          (the two transports)
    <- server/            (the daemon)
    <- cli/               (the command line)

Modules here may import only each other and third-party libraries, never a subpackage.
"""


_version: str | None = None


def __getattr__(name: str) -> str:
    """`__version__`, read from the installed metadata when first asked: importlib.metadata costs ~40 ms, too
    much for `memento-sessions hook`, which runs once per agent tool call and never needs it."""
    if name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    global _version
    if _version is None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            _version = version("memento-sessions")
        except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
            _version = "0.0.0"
    return _version
