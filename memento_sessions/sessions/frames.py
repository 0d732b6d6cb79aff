"""The `session.event` frame: the one place in Python that builds it and reads its seq and epoch.

The live frame is built by the Function that stores the event (functions.lua, `publish_event`), so that
the store and the PUBLISH are one atomic call; a replay rebuilds the same bytes here from the stored
member. Both write exactly

    {"jsonrpc":"2.0","method":"session.event","params":{"seq":N,"epoch":"E","sessionId":S,"event":M}}

where M is the stored ZSET member, which itself starts `{"seq":N,`. Readers take seq and epoch by
offset instead of parsing the JSON: a frame is read once per message, not once per subscriber
(`frame_head`), and never decoded on the fan-out path. tests/test_frames.py checks these readers on
the frames the Function itself publishes.
"""

from __future__ import annotations

from typing import Any

from memento_sessions.redisio.fanout import per_message

EVENT_HEAD = '{"jsonrpc":"2.0","method":"session.event","params":{"seq":'
_EPOCH = ',"epoch":"'
MEMBER_HEAD = '{"seq":'


def event_frame(session_json: str, epoch: str, member: str, seq: Any) -> str:
    """The frame the Function publishes for a stored event, rebuilt from its ZSET member (for replays)."""
    return (EVENT_HEAD + str(int(seq)) + _EPOCH + epoch + '","sessionId":' + session_json + ',"event":' + member
            + "}}")


def frame_seq(frame: str) -> int | None:
    """The seq of a `session.event` frame (its first param), else None."""
    if not frame.startswith(EVENT_HEAD):
        return None
    return int(frame[len(EVENT_HEAD):frame.find(",", len(EVENT_HEAD))])


def frame_epoch(frame: str) -> str:
    """The epoch of a `session.event` frame, which follows its seq: `{"seq":N,"epoch":"E",`."""
    start = frame.index(_EPOCH, len(EVENT_HEAD)) + len(_EPOCH)
    return frame[start:frame.index('"', start)]


def _head(frame: str) -> tuple[int, str] | None:
    seq = frame_seq(frame)
    return None if seq is None else (seq, frame_epoch(frame))


frame_head = per_message(_head)
"""(seq, epoch) of a `session.event` frame; None for any other frame (e.g. `session.checkpoint`).
Read once per message, however many subscribers it reaches."""


def member_seq(member: str) -> int:
    """The seq of a stored event (a ZSET member), which always starts `{"seq":N,`."""
    return int(member[len(MEMBER_HEAD):member.index(",", len(MEMBER_HEAD))])
