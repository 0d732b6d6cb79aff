"""The detached child that takes the freshness stamp for the hook (gitstate.py says why and how).

`spawn` starts it (`python -m memento_sessions.cli.stamp JOB`, JOB the input's session, event, directory, read
time and spool folder), `stamp_later` is what it does, `wait_for_children` is `hook --flush` waiting for every
one still running (each holds `<spool>/stamping.lock` shared; the hook takes it before the spawn).
"""

from __future__ import annotations

import fcntl
import os
import time

from memento_sessions.cli import fastjson
from memento_sessions.cli.gitstate import DEFERRED, FIELD, LOCK, PATCH_FIELD, stamp
from memento_sessions.cli.spool import spool

NICE = 10  # the child's niceness
DELIVERY = 5.0  # seconds the child may spend delivering the spool (else the next hook call does)
WAIT = 30.0  # seconds `hook --flush` waits at most for the children (each ends at MEMENTO_HOOK_GIT_TIMEOUT once run)
TYPE_CHECKING = False  # not `typing` (mypy takes any name TYPE_CHECKING as true)
if TYPE_CHECKING:
    from typing import Any


def spawn(record: dict[str, Any], at: str, folder: str) -> None:
    """Start the detached child that stamps the input read at `at` and spools its stamps (see the module)."""
    import sys

    keep = {key: record.get(key) for key in ("session_id", "hook_event_name", "cwd")}
    job = fastjson.dumps({"at": at, "folder": folder, "input": keep})
    lock = os.open(os.path.join(folder, LOCK), os.O_RDONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_SH)  # now: a --flush right after this hook waits for the child
        os.set_inheritable(lock, True)  # (were it descriptor 3 already, the dup2 below would keep close-on-exec)
        null = os.devnull
        actions = [(os.POSIX_SPAWN_OPEN, 0, null, os.O_RDONLY, 0), (os.POSIX_SPAWN_OPEN, 1, null, os.O_WRONLY, 0),
                   (os.POSIX_SPAWN_OPEN, 2, null, os.O_WRONLY, 0), (os.POSIX_SPAWN_DUP2, lock, 3)]
        os.posix_spawn(sys.executable, [sys.executable, "-m", "memento_sessions.cli.stamp", job], os.environ,
                       file_actions=actions, setsid=True)
    finally:
        os.close(lock)  # the child's descriptor 3 keeps the lock until it exits


def stamp_later(job: dict[str, Any]) -> None:
    """The child: stamp the input, spool its stamps as a line of their own (nothing when none was found), and
    deliver the spool, unless a hook call is delivering it already."""
    record = job["input"]
    stamp(record)
    if any(key in record for key in (FIELD, PATCH_FIELD)):
        spool({**record, DEFERRED: True}, job["folder"], at=job["at"])
        from memento_sessions.cli.hook import deliver  # now, so the next call finds nothing waiting (its one POST)

        deliver(job["folder"], time.monotonic() + DELIVERY)


def wait_for_children(folder: str, longest: float = WAIT) -> bool:
    """Until every detached child stamping for this spool is done (`hook --flush`), at most `longest` seconds;
    whether they are."""
    os.makedirs(folder, mode=0o700, exist_ok=True)
    deadline = time.monotonic() + longest
    lock = os.open(os.path.join(folder, LOCK), os.O_RDONLY | os.O_CREAT, 0o600)
    try:
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.02)
    finally:
        os.close(lock)


if __name__ == "__main__":
    import sys

    try:
        # Niced (git inherits it): on a busy machine it yields to the hook calls, its own parent's included.
        os.nice(NICE)
        stamp_later(fastjson.loads(sys.argv[1]))
    except Exception:  # nowhere to say it (stdio is /dev/null): the stamp is just missing, as past its timeout
        pass
