"""memento-sessions: a real-time coordination daemon for swarms of AI agents.

The package is laid out by stage; a package imports only from the ones before it in this order
(tests/test_layout.py checks it; docs/layout.md says why):

    the shared ground (this root: settings, errors, auth, keys, metrics, logs, rpc, backends,
    ratelimit, endpoints)
    <- redisio/ (with the leaves embedded/, client/, ingest/, dashboard/)
    <- sessions/ <- kg/ <- checkpoints/ <- bridge/ <- ws/ and mcp/ <- server/ <- cli.py

Modules here may import only each other and third-party libraries, never a subpackage (cli.py,
the command line over everything, is the one exception).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("memento-sessions")
except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
    __version__ = "0.0.0"
