"""The coordination Function library: loaded at start, re-loaded if Redis lost it, errors translated once."""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from memento_sessions.backends import is_cluster_client
from memento_sessions.errors import Forbidden
from memento_sessions.logs import get_logger
from memento_sessions.redisio.pipe import Acks, Pipe, call_acked
from memento_sessions.sessions.functions import translate

log = get_logger(__name__)
# The writes a failover must not lose once answered, waited on with MEMENTO_REPLICA_ACKS >= 1: a lease granted,
# renewed or released (a grant lost with its primary would hand its fencing token out again) and a message sent;
# a grant in parts waits on its last call (mc_commit), which covers the parts written before it on its connection.
WAITED = frozenset({"mc_acquire", "mc_commit", "mc_renew", "mc_release", "mc_post", "mc_send"})
LIBRARY = resources.files("memento_sessions.coordination").joinpath("coordination.lua").read_text()


class CoordStore:
    """FCALLs the `memento_coord` functions, over the auto-pipelined connection when there is one."""

    def __init__(self, redis: aioredis.Redis, pipe: Pipe | None = None, acks: Acks | None = None) -> None:
        """`acks`: the replicas a WAITED function's write must reach before it is answered (None: not waited)."""
        self.redis = redis
        self.pipe = pipe
        self.acks = acks
        # A session's channel is a shard channel on a Redis Cluster (keys.session_channel): published with SPUBLISH.
        self.session_publish = "SPUBLISH" if is_cluster_client(redis) else "PUBLISH"

    async def load(self) -> None:
        """(Re)load the library; REPLACE makes this safe for every daemon at every start."""
        await self.redis.function_load(LIBRARY, replace=True)

    async def call(self, function: str, keys: Sequence[str], *args: str | int) -> Any:
        """FCALL `function`; a function error becomes its JSON-RPC error."""
        fcall = ("FCALL", function, len(keys), *keys, *args)
        acks = self.acks if function in WAITED else None
        try:
            return await self._acked(acks, fcall) if acks else await self.command(*fcall)
        except ResponseError as exc:
            if "Function not found" not in str(exc):
                raise coord_error(str(exc)) from None
        log.warning("redis lost the coordination library; reloading")
        await self.load()
        try:
            return await self._acked(acks, fcall) if acks else await self.command(*fcall)
        except ResponseError as exc:
            raise coord_error(str(exc)) from None

    async def _acked(self, acks: Acks, fcall: tuple[str | int, ...]) -> Any:
        """The call and a WAIT after it on one connection, as an emit's (redisio.pipe.call_acked)."""
        return await call_acked(self.redis, self.pipe, acks, *fcall)

    async def command(self, *args: str | int | float) -> Any:
        """One command over the pipe (in order with the emits) or the pooled client."""
        if self.pipe is not None:
            return await self.pipe.call(*args)
        return await self.redis.execute_command(*args)  # type: ignore[no-untyped-call]


def coord_error(message: str) -> Exception:
    """FORBIDDEN replies become Forbidden; the rest as the sessions library's errors."""
    word, _, text = message.partition(" ")
    return Forbidden(text) if word == "FORBIDDEN" else translate(message)
