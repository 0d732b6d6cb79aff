"""The command hook's one round trip: its input POSTed to the daemon's `/hooks/claude-code`, which stores the
input's events while it makes the answer (docs/hooks.md, "The hook's time").

Taken only when the spool holds nothing before the input just spooled, no other hook is delivering, and the
input has nothing to convert here (a commit stamp): then the spool's order is kept, and the input's events are
those the WebSocket delivery would send, since the hook sends what the spool keeps with it (the time it read
it, the project root): written once whichever path sends them. Once the daemon says they are stored, the
spool's offset moves past the input. Anything else is the WebSocket path's (cli/hook.py\'s `answer`, then deliver).
"""

from __future__ import annotations

import fcntl
import os

from memento_sessions.cli import fastjson
from memento_sessions.cli.hook import ANSWER_BUDGET, POLICIES, STARTED, daemon_url
from memento_sessions.cli.spool import Locked, compact, read_offset, write_offset

TYPE_CHECKING = False  # not `typing` (mypy takes any name TYPE_CHECKING as true)
if TYPE_CHECKING:
    from typing import Any

PATH = "/hooks/claude-code"
ROOT_MAX = 4096  # characters of a project root in a header (the daemon's bound too)


class Posted:
    """What a post gave: the answer to print (None: nothing to say, or the daemon away) and whether the daemon
    stored the input's events (then it is delivered)."""

    __slots__ = ("answer", "recorded")

    def __init__(self, answer: dict[str, Any] | None = None, recorded: bool = False) -> None:
        self.answer, self.recorded = answer, recorded


NOT_TAKEN = Posted()  # the WebSocket path asks and delivers


def post_input(record: dict[str, Any], at: str, start: int, end: int, folder: str) -> Posted:
    """The post of the input spooled at [start, end) of the spool, read at `at`; NOT_TAKEN when it is not for
    this path or the daemon does not take it (another status than 200, a reply that is not JSON)."""
    from memento_sessions.cli.gitstate import COMMIT_FIELD

    token, headers = os.environ.get("MEMENTO_TOKEN"), post_headers(record, at)
    if not token or headers is None or COMMIT_FIELD in record:
        return NOT_TAKEN
    from memento_sessions.cli.wire import WireError, post

    try:
        with Locked(os.path.join(folder, "deliver.lock"), os.O_WRONLY | os.O_CREAT, fcntl.LOCK_EX | fcntl.LOCK_NB):
            if read_offset(folder) != start:
                return NOT_TAKEN
            try:
                status, replied, body = post(daemon_url(), token, PATH, fastjson.dumps(record).encode(), headers,
                                             STARTED + ANSWER_BUDGET)
            except WireError:  # the daemon away: allowed, the input stays spooled
                return Posted()
            said = fastjson.loads(body) if status == 200 else None
            if not isinstance(said, dict):
                return NOT_TAKEN
            recorded = replied.get("x-memento-hook-recorded") == "1"
            if recorded:
                write_offset(folder, end)
                compact(folder)
            return Posted(said or None, recorded)
    except (BlockingIOError, ValueError):  # another hook is delivering; a reply that is not JSON
        return NOT_TAKEN


def post_headers(record: dict[str, Any], at: str) -> dict[str, str] | None:
    """The spooled input's read time and root, and this project's lease policy and claim when set; None when
    the root cannot go in a header (not printable ASCII, too long): the WebSocket path sends it then."""
    env = os.environ
    root = env.get("CLAUDE_PROJECT_DIR") or record.get("cwd")
    headers = {"X-Memento-Hook-At": at}
    if isinstance(root, str) and root:
        if not (root.isprintable() and root.isascii() and len(root) <= ROOT_MAX):
            return None
        headers["X-Memento-Hook-Root"] = root
    if env.get("MEMENTO_HOOK_LEASES") in POLICIES:
        headers["X-Memento-Hook-Leases"] = env["MEMENTO_HOOK_LEASES"]
    ttl = env.get("MEMENTO_HOOK_CLAIM_TTL", "")
    if ttl.isdigit() and int(ttl) <= 3600:
        headers["X-Memento-Hook-Claim-Ttl"] = ttl
    return headers
