"""structlog configured once: JSON lines in production, console on a TTY."""

from __future__ import annotations

import logging
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
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    # Libraries that use stdlib logging (uvicorn, mcp) go to stderr at warning and above.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")
    logging.getLogger("uvicorn.error").addFilter(_not_denial_noise)


def _not_denial_noise(record: logging.LogRecord) -> bool:
    """uvicorn logs every refused WebSocket handshake (our 401/503 denial responses) as an error."""
    return "without completing handshake" not in record.getMessage()


def get_logger(name: str) -> structlog.typing.FilteringBoundLogger:
    """A bound logger named for its module."""
    logger: structlog.typing.FilteringBoundLogger = structlog.get_logger(logger_name=name)
    return logger
