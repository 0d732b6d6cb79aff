"""sessions/frames.py reads and rebuilds the very frames the Redis Function publishes (functions.lua publish_event)."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
import redis.asyncio as aioredis

from memento_sessions import keys
from memento_sessions.auth import Identity
from memento_sessions.backends import is_cluster_client
from memento_sessions.sessions.frames import event_frame, frame_epoch, frame_head, frame_seq, member_seq
from memento_sessions.sessions.manager import SessionManager
from memento_sessions.sessions.models import EventIn
from memento_sessions.sessions.paging import seq_of
from memento_sessions.settings import Settings
from memento_sessions.ws.frames import framed, text_frame

pytestmark = pytest.mark.anyio


async def published(settings: Settings, namespace: str, session_id: str, count: int) -> tuple[list[str], str]:
    """Create `session_id` with a start event (ms_create) and emit two more (ms_emit, one of them a batch of
    two), reading the frames raw off the session's channel; returns them and the session's epoch."""
    redis = aioredis.Redis.from_url(settings.redis_url or "", decode_responses=True)
    pubsub: Any = redis.pubsub()
    # On a cluster the Functions SPUBLISH a session's frames: a plain SUBSCRIBE would hear nothing.
    sharded = is_cluster_client(redis)
    await redis.ping()  # a RedisCluster reads the slots on its first command; ssubscribe routes by them
    channel = keys.session_channel(namespace, session_id)
    await (pubsub.ssubscribe(channel) if sharded else pubsub.subscribe(channel))
    receive = pubsub.get_sharded_message if sharded else pubsub.get_message
    manager = SessionManager(redis, settings)
    await manager.start()
    who = Identity("agent-f", namespace, frozenset({"sessions:write"}))
    created = await manager.create(who, entity_ids=["fn:a"], session_id=session_id)
    await manager.emit(who, session_id, EventIn(type="modified", id="m1", data={"text": 'quote " and é'}))
    await manager.emit_batch(who, session_id, [EventIn(type="broke"), EventIn(type="test_pass")])
    frames: list[str] = []
    with anyio.fail_after(5):
        while len(frames) < count:
            message = await receive(ignore_subscribe_messages=True, timeout=1)
            if message is not None:
                frames.append(message["data"])
    await pubsub.aclose()
    await redis.aclose()
    return frames, created["epoch"]


async def test_the_functions_own_frames_are_read_and_rebuilt_byte_for_byte(settings: Settings,
                                                                           namespace: str) -> None:
    session_id = "frames.1:a"
    frames, epoch = await published(settings, namespace, session_id, 4)
    assert [frame_head(frame) for frame in frames] == [(1, epoch), (2, epoch), (3, epoch), (4, epoch)]
    assert [frame_seq(frame) for frame in frames] == [1, 2, 3, 4]
    assert {frame_epoch(frame) for frame in frames} == {epoch}
    parsed = [json.loads(frame) for frame in frames]
    assert [(p["method"], p["params"]["seq"], p["params"]["epoch"], p["params"]["sessionId"]) for p in parsed] == \
        [("session.event", seq, epoch, session_id) for seq in (1, 2, 3, 4)]
    assert [p["params"]["event"]["type"] for p in parsed] == ["start", "modified", "broke", "test_pass"]
    redis = aioredis.Redis.from_url(settings.redis_url or "", decode_responses=True)
    members: list[Any] = await redis.zrange(keys.session_keys(namespace, session_id).events, 0, -1)
    await redis.aclose()
    assert [member_seq(member) for member in members] == [seq_of(member) for member in members] == [1, 2, 3, 4]
    session_json = json.dumps(session_id, ensure_ascii=False, separators=(",", ":"))
    # a replay sends exactly what a live subscriber got
    assert [event_frame(session_json, epoch, member, member_seq(member)) for member in members] == frames


def test_other_frames_have_no_head_and_each_message_is_read_afresh() -> None:
    checkpoint = '{"jsonrpc":"2.0","method":"session.checkpoint","params":{"sessionId":"s","seq":3}}'
    assert frame_seq(checkpoint) is None and frame_head(checkpoint) is None
    one = event_frame('"s"', "e1", '{"seq":7,"type":"modified"}', 7)
    two = event_frame('"s"', "e2", '{"seq":8,"type":"modified"}', 8)
    assert (frame_head(one), frame_head(one), frame_head(two), frame_head(one)) == ((7, "e1"), (7, "e1"), (8, "e2"),
                                                                                   (7, "e1"))
    assert framed(one) is framed(one), "one message is encoded once, however many subscribers get it"
    assert (framed(one), framed(two)) == (text_frame(one.encode()), text_frame(two.encode()))
