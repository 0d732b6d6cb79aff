"""The daemon's background loops go on after a failed pass.

Each loop (the index janitor, the lifecycle's idle and archive pass, the snapshot flush, the lease
reaper, retention) runs one pass, sleeps, and runs the next. A pass that raises must not end the loop:
the loops run in the daemon's task group, so one escaped exception would stop the whole daemon for a
blip that the next pass would have ridden out. `one_pass` is the one place that decides how a failed
pass is told: briefly away backends as a warning, anything else with its traceback.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from memento_sessions.logs import get_logger

log = get_logger(__name__)
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
        log.warning("background pass failed; the next pass tries again", job=what, error=repr(exc))
    except Exception:
        log.exception("background pass failed unexpectedly; the next pass tries again", job=what)
    return None
