"""When a checkpoint is due: the emits the manager reports, turned into a bounded queue of sessions to checkpoint.

Built before the SessionManager and passed to it (`on_emitted`), so the manager's constructor names every
one it tells of an emit; the Checkpointer takes the queue's other end.
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from memento_sessions.logs import get_logger
from memento_sessions.sessions.manager import Emitted

log = get_logger("memento_sessions.checkpoints.checkpointer")  # the lines it logged from there
QUEUE_SIZE = 1024


class Triggers:
    """The sessions whose checkpoint is due, each queued once at a time; a full queue drops a trigger."""

    def __init__(self, every: int) -> None:
        self.every = every
        send, receive = anyio.create_memory_object_stream[tuple[str, str]](QUEUE_SIZE)
        self.send: MemoryObjectSendStream[tuple[str, str]] = send
        self.receive: MemoryObjectReceiveStream[tuple[str, str]] = receive
        self.queued: set[tuple[str, str]] = set()

    def on_emitted(self, namespace: str, session_id: str, done: Sequence[Emitted]) -> None:
        """Queue a checkpoint when an emit crossed a multiple of N or carried a `checkpoint` event."""
        if any(not e.duplicate and (e.seq % self.every == 0 or e.event.type == "checkpoint") for e in done):
            self.request(namespace, session_id)

    def request(self, namespace: str, session_id: str) -> None:
        """Queue a checkpoint; a full queue drops it (the next checkpoint covers its window)."""
        key = (namespace, session_id)
        if key in self.queued:
            return
        try:
            self.send.send_nowait(key)
        except anyio.WouldBlock:
            log.warning("checkpoint queue full; trigger dropped", session_id=session_id)
            return
        except anyio.ClosedResourceError:
            return  # the daemon is stopping: the next daemon's checkpoint covers the window
        self.queued.add(key)
