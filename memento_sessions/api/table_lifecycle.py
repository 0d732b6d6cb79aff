"""The event-sourcing and lifecycle methods, declared: session.diff, .snapshot, .compact, .fork, .suspend,
.resume and .clear."""

from __future__ import annotations

from memento_sessions.api.args import AtSeq, BeforeSeq, ForkSessionId, FromSeq, LifecycleSessionId, ToSeq
from memento_sessions.api.spec import ADMIN, READ, WRITE, Arg, Declared, Tool
from memento_sessions.client.results import Cleared, Compacted, Diff, Forked, Moved, Snapshotted
from memento_sessions.history.methods import CompactParams, DiffParams
from memento_sessions.lifecycle.methods import ForkParams
from memento_sessions.sessions.methods import SessionParams

LIFECYCLE: tuple[Declared, ...] = (
    Declared(
        "session.diff",
        DiffParams,
        Diff,
        READ,
        lambda s: s.history.diff,
        "What happened in a session between two seqs.",
        tools=(
            Tool(
                "diff_session",
                22,
                "read",
                (
                    Arg("sessionId", LifecycleSessionId),
                    Arg("fromSeq", FromSeq),
                    Arg("toSeq", ToSeq),
                ),
                """Compare a session at two points: what happened after fromSeq up to toSeq. Returns the state at each
                end, how many events and of which types, the entities changed, the agents that joined in between,
                the working/broken transitions and the summed perfDelta. Use it to review a stretch of someone's
                work or to see what a range of changes did. fromSeq after toSeq is invalid params (-32602).""",
            ),
        ),
    ),
    Declared(
        "session.snapshot",
        SessionParams,
        Snapshotted,
        WRITE,
        lambda s: s.history.snapshot,
        "Store the session's condensed state at its current seq.",
        tools=(
            Tool(
                "snapshot_session",
                23,
                "idempotent",
                (Arg("sessionId", LifecycleSessionId),),
                """Save the session's condensed state at its current seq, so later reads and time travel to this point
                are quick. Returns the snapshot's id, its seq and when it was made. Safe to repeat.""",
            ),
        ),
    ),
    Declared(
        "session.compact",
        CompactParams,
        Compacted,
        WRITE,
        lambda s: s.history.compact,
        "Snapshot a session and remove its events up to a seq.",
        tools=(
            Tool(
                "compact_session",
                24,
                "destructive",
                (
                    Arg("sessionId", LifecycleSessionId),
                    Arg("beforeSeq", BeforeSeq, None),
                ),
                """Free room in a long session: snapshot its state at beforeSeq and remove the events up to it, keeping
                the recent ones. Reads below that point then return the snapshot instead of the events. Compaction
                never removes events a pending checkpoint still needs, so it may stop earlier than asked: the reply's
                compactedSeq says where it stopped and removed how many events went.""",
            ),
        ),
    ),
    Declared(
        "session.fork",
        ForkParams,
        Forked,
        WRITE,
        lambda s: s.lifecycle.fork,
        "A new session whose history is another's events up to atSeq.",
        tools=(
            Tool(
                "fork_session",
                25,
                "write",
                (
                    Arg("sessionId", LifecycleSessionId),
                    Arg("atSeq", AtSeq),
                    Arg("newSessionId", ForkSessionId, None),
                ),
                """Branch a session: a new session whose history is the original's events 1..atSeq (same seqs, same
                content) and whose next event is atSeq+1, to try another approach from a known point. The original
                is not changed; a suspended session can be forked too. Returns the fork's id, its state at atSeq and
                its parentSessionId and forkedAtSeq.""",
            ),
        ),
    ),
    Declared(
        "session.suspend",
        SessionParams,
        Moved,
        WRITE,
        lambda s: s.lifecycle.suspend,
        "Move a session to Postgres, whole and exact.",
        tools=(
            Tool(
                "suspend_session",
                26,
                "idempotent",
                (Arg("sessionId", LifecycleSessionId),),
                """Put a session you are pausing into long-term storage, whole and exact, instead of letting it expire.
                Nobody can emit into it while it is suspended; resume_session brings it back as it was. Safe to
                repeat. A completed session is not suspended (conflict -32009).""",
            ),
        ),
    ),
    Declared(
        "session.resume",
        SessionParams,
        Moved,
        WRITE,
        lambda s: s.lifecycle.resume,
        "Bring a suspended session back to Redis.",
        tools=(
            Tool(
                "resume_session",
                27,
                "idempotent",
                (Arg("sessionId", LifecycleSessionId),),
                """Bring a suspended session back to life with the same seqs and epoch, so agents and subscribers carry
                on where they were. Fails with conflict (-32009, reason active) when the session is not suspended.""",
            ),
        ),
    ),
    Declared(
        "session.clear",
        SessionParams,
        Cleared,
        ADMIN,
        lambda s: s.lifecycle.clear,
        "Delete a session everywhere (admin).",
    ),
)
