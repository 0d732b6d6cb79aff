"""structlog configured once: JSON lines in production, console on a TTY."""

from __future__ import annotations

import logging
import re
import sys

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure_logging(log_format: str | None = None, level: str = "info") -> None:
    """Set the processor chain; `log_format` None picks console on a TTY, else JSON."""
    fmt = log_format or ("console" if sys.stderr.isatty() else "json")
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer() if fmt == "console" else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(file=_Stderr()),  # type: ignore[arg-type]
        # Not cached: a logger keeps the chain configured now, so a later configure (a test's capture_logs, a
        # command run in-process after another) would miss every module that had logged once. Logging is off
        # the hot path (warnings, connections, passes), so a bind per call costs nothing measurable.
        cache_logger_on_first_use=False,
    )
    # Libraries that use stdlib logging (uvicorn, mcp) go to stderr at warning and above.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")
    guard_library_logs()


def guard_library_logs() -> None:
    """Filters on uvicorn's logger, whoever configured logging (idempotent).

    uvicorn logs each accepted WebSocket at info with its path and query string, where our clients
    carry `?token=`: wherever that level is let through (an embedding application's own logging
    setup), the token is masked. And the refused handshakes it logs as errors are dropped.
    """
    uvicorn_logger = logging.getLogger("uvicorn.error")
    for guard in (_not_denial_noise, _mask_tokens):
        if guard not in uvicorn_logger.filters:
            uvicorn_logger.addFilter(guard)


def _not_denial_noise(record: logging.LogRecord) -> bool:
    """uvicorn logs every refused WebSocket handshake (our 401/503 denial responses) as an error."""
    return "without completing handshake" not in record.getMessage()


_TOKEN = re.compile(r"(token=)[^&\s\"']+")


def _mask_tokens(record: logging.LogRecord) -> bool:
    """`token=<jwt>` in a record's message or arguments becomes `token=***`."""
    if isinstance(record.msg, str):
        record.msg = _TOKEN.sub(r"\1***", record.msg)
    if isinstance(record.args, tuple):
        record.args = tuple(_TOKEN.sub(r"\1***", arg) if isinstance(arg, str) else arg for arg in record.args)
    return True


def get_logger(name: str) -> structlog.typing.FilteringBoundLogger:
    """A bound logger named for its module."""
    logger: structlog.typing.FilteringBoundLogger = structlog.get_logger(logger_name=name)
    return logger


class _Stderr:
    """Whatever sys.stderr is when a line is written, not when logging was configured: a stream swapped
    for a while (a test's capture, a daemon embedded in another program) and then closed is never held."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()
