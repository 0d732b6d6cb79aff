"""The command line: `memento-sessions` and its commands, the top of the package order.

commands.py (the parser and `main`: serve, token, check, kg, prune, mcp, ...), hook.py (`hook`: one agent
hook input -> its events, the daemon's answer printed), post.py (the hook's one round trip to the daemon),
spool.py (the hook's spool while the daemon is away), stamp.py (the detached child that takes the git
freshness stamp), gitstate.py (the agent's git state: HEAD, dirty digest, commits, uncommitted work),
fastjson.py (JSON for the hook's lean path), wire.py (a blocking JSON-RPC client over one WebSocket),
pipeline.py (requests pipelined on it), ingest.py (`ingest FILE...`), session.py (`session ...`),
usage.py (`usage`), extras.py (which install a missing module belongs to).

May import every package below. The hook's modules (hook, post, spool, stamp, gitstate, fastjson, wire)
import only the standard library and ingest/, and this file imports nothing at all: `memento-sessions hook`
runs once per agent tool call and must start fast.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script (commands.py's `main`, imported when called)."""
    from memento_sessions.cli.commands import main as run

    return run(argv)
