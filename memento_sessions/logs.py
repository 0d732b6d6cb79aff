"""structlog configured once: JSON lines in production, console on a TTY.

The libraries' stdlib loggers (uvicorn, the MCP SDK, asyncpg) go through the same renderer, so with
JSON logs every line is one JSON object, a traceback inside it (`exception`). A client that goes away
mid-request is one debug line, not uvicorn's "Exception in ASGI application" traceback.

`one_pass` is how every background loop of the daemon tells a failed pass, and goes on.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Awaitable, Callable
from typing import TypeVar

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


_HANDLER = "memento-sessions"  # the name of our handler on the root logger, replaced at each configure


def configure_logging(log_format: str | None = None, level: str = "info") -> None:
    """Set the processor chain; `log_format` None picks console on a TTY, else JSON."""
    fmt = log_format or ("console" if sys.stderr.isatty() else "json")
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer() if fmt == "console" else structlog.processors.JSONRenderer()
    )
    timestamper = structlog.processors.TimeStamper(fmt="iso", utc=True)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            timestamper,
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
    _route_library_logs(renderer, timestamper, max(logging.WARNING, _LEVELS[level]))
    guard_library_logs()


def _route_library_logs(renderer: structlog.typing.Processor, timestamper: structlog.typing.Processor,
                        level: int) -> None:
    """Libraries that use stdlib logging (uvicorn, mcp, asyncpg) render as ours, at warning and above."""
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[_logger_name, structlog.stdlib.add_log_level, timestamper],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info, renderer],
    )
    handler = logging.StreamHandler(_Stderr())
    handler.set_name(_HANDLER)
    handler.setFormatter(formatter)
    handler.addFilter(_client_gone)  # for the MCP SDK's loggers, which carry no filter of ours
    root = logging.getLogger()
    for old in [old for old in root.handlers if old.get_name() == _HANDLER]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)


def guard_library_logs() -> None:
    """Filters on uvicorn's logger, whoever configured logging (idempotent).

    uvicorn logs each accepted WebSocket at info with its path and query string, where our clients
    carry `?token=`: wherever that level is let through (an embedding application's own logging
    setup), the token is masked. And the refused handshakes it logs as errors are dropped.
    """
    uvicorn_logger = logging.getLogger("uvicorn.error")
    for guard in (_not_denial_noise, _client_gone, _mask_tokens):
        if guard not in uvicorn_logger.filters:
            uvicorn_logger.addFilter(guard)


def _not_denial_noise(record: logging.LogRecord) -> bool:
    """uvicorn logs every refused WebSocket handshake (our 401/503 denial responses) as an error."""
    return "without completing handshake" not in record.getMessage()


def _logger_name(_: object, __: str, event: structlog.typing.EventDict) -> structlog.typing.EventDict:
    """The record's logger under the key our own lines use."""
    event["logger_name"] = event["_record"].name
    return event


# What a request's task raises when its client has gone: starlette's ClientDisconnect, anyio's stream errors,
# a reset or broken socket. Matched by class name so that logging imports neither library.
_GONE = frozenset({"ClientDisconnect", "ClosedResourceError", "BrokenResourceError", "EndOfStream",
                   "ConnectionError"})


def _is_client_gone(exc: BaseException) -> bool:
    """`exc` (or every exception of a group) is a client gone, or was raised while handling one (starlette's
    "Unexpected ASGI message ... after response already completed" as it tries to answer a vanished client)."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_is_client_gone(inner) for inner in exc.exceptions)
    if any(cls.__name__ in _GONE for cls in type(exc).__mro__):
        return True
    return isinstance(exc, RuntimeError) and exc.__context__ is not None and _is_client_gone(exc.__context__)


def _client_gone(record: logging.LogRecord) -> bool:
    """A traceback from uvicorn or the MCP SDK for a client that went away becomes one debug line."""
    if not record.name.startswith(("uvicorn", "mcp")) or not record.exc_info or record.exc_info[1] is None:
        return True
    exc = record.exc_info[1]
    if not _is_client_gone(exc):
        return True
    get_logger(record.name).debug("client went away", message=record.getMessage().strip(), error=repr(exc)[:200])
    return False


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


# The daemon's background loops go on after a failed pass. Each loop (the index janitor, the lifecycle's
# idle and archive pass, the snapshot flush, the lease reaper, retention) runs one pass, sleeps, and runs
# the next. A pass that raises must not end the loop: the loops run in the daemon's task group, so one
# escaped exception would stop the whole daemon for a blip that the next pass would have ridden out.
# `one_pass` is the one place that decides how a failed pass is told: briefly away backends as a warning,
# anything else with its traceback.

_loop_log = get_logger(__name__)
T = TypeVar("T")


async def one_pass(job: Callable[[], Awaitable[T]], what: str,
                   expected: tuple[type[BaseException], ...] = ()) -> T | None:
    """`job()`'s result, or None when it failed (logged; the loop's next pass tries again).

    An `expected` error (a backend briefly away) is a warning without traceback; any other Exception is
    a bug and is logged with its traceback. Cancellation is not an Exception and passes through, so a
    stopping daemon still stops.
    """
    try:
        return await job()
    except expected as exc:
        _loop_log.warning("background pass failed; the next pass tries again", job=what, error=repr(exc))
    except Exception:
        _loop_log.exception("background pass failed unexpectedly; the next pass tries again", job=what)
    return None
