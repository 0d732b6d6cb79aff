"""memento-sessions: a real-time coordination daemon for swarms of AI agents."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("memento-sessions")
except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
    __version__ = "0.0.0"
