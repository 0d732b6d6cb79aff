"""memento-sessions: a real-time coordination daemon for swarms of AI agents.

The package is laid out by stage; a package imports only from the ones before it in this order
(tests/test_layout.py checks it; docs/layout.md says why):

    the shared ground (this root: settings, errors, auth, keys, metrics, logs, rpc, backends,
    ratelimit, pacing, endpoints)
    <- ingest/ (pure: imports nothing of the package)
    <- redisio/ (with the leaves embedded/, client/, dashboard/)
    <- sessions/ <- kg/ <- checkpoints/ <- bridge/ <- ws/ and mcp/ <- server/ <- cli.py and the cli_*.py commands

Modules here may import only each other and third-party libraries, never a subpackage (cli.py and
cli_*.py, the command line over everything, are the exception).
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
