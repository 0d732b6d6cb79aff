"""The Redis Function library: loaded at start, re-loaded if Redis lost it, errors translated once."""

from __future__ import annotations

from importlib import resources
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import BusyLoadingError, ResponseError

from memento_sessions.backends import is_cluster_client
from memento_sessions.errors import Conflict, NotFound, RpcError
from memento_sessions.keys import SessionKeys
from memento_sessions.logs import get_logger
from memento_sessions.redisio.pipe import Acks, Pipe, call_acked

log = get_logger(__name__)
LIBRARY = resources.files("memento_sessions.sessions").joinpath("functions.lua").read_text()
_PUBLISH = "local SESSION_PUBLISH = 'PUBLISH'"
_NUMSUB = "local SESSION_NUMSUB = 'NUMSUB'"
_ERRORS: dict[str, type[RpcError]] = {"NOTFOUND": NotFound, "CONFLICT": Conflict, "EXISTS": Conflict}


class FunctionStore:
    """Calls the `memento_v1` functions on one Redis, loading the library whenever it is missing."""

    def __init__(self, redis: aioredis.Redis, pipe: Pipe | None = None) -> None:
        self.redis = redis
        self.pipe = pipe
        self.library = library(cluster=is_cluster_client(redis))

    async def load(self) -> None:
        """(Re)load the library; REPLACE makes this safe for every daemon at every start. On a Redis Cluster
        redis-py sends FUNCTION LOAD to every primary (a promoted replica has it already: it replicates)."""
        await self.redis.function_load(self.library, replace=True)

    async def call(self, function: str, keys: SessionKeys, *args: str | int | float, acks: Acks | None = None) -> Any:
        """FCALL `function`; a function error becomes its JSON-RPC error. With `acks`, answered once that many
        replicas hold the write (-32050 replica_ack_timeout past the timeout)."""
        try:
            return await self._fcall(function, keys, args, acks)
        except ResponseError as exc:
            message = str(exc)
            if "Function not found" not in message:
                raise translate(message) from None
        log.warning("redis lost the function library; reloading")
        await self.load()
        try:
            return await self._fcall(function, keys, args, acks)
        except ResponseError as exc:
            raise translate(str(exc)) from None

    async def add_to_index(self, index: str, session_id: str, now: int, max_sessions: int) -> bool:
        """Index a new session unless the namespace is full (Conflict namespace_full); False if already indexed."""
        try:
            added = await self.redis.fcall("ms_index_add", 1, index, session_id, now, max_sessions)
        except ResponseError as exc:
            if "Function not found" not in str(exc):
                raise translate(str(exc)) from None
            await self.load()
            return await self.add_to_index(index, session_id, now, max_sessions)
        return bool(added)

    async def _fcall(self, function: str, keys: SessionKeys, args: tuple[str | int | float, ...],
                     acks: Acks | None = None) -> Any:
        if acks is not None:
            return await self._fcall_acked(function, keys, args, acks)
        if self.pipe is not None:
            return await self.pipe.call("FCALL", function, 4, *keys.all(), *args)
        return await self.redis.fcall(function, 4, *keys.all(), *args)

    async def _fcall_acked(self, function: str, keys: SessionKeys, args: tuple[str | int | float, ...],
                           acks: Acks) -> Any:
        """The FCALL and a WAIT after it on one connection (redisio.pipe.call_acked)."""
        return await call_acked(self.redis, self.pipe, acks, "FCALL", function, 4, *keys.all(), *args)


def library(*, cluster: bool) -> str:
    """The library's code: on a Redis Cluster, sessions' frames are SPUBLISHed and their listeners counted with
    SHARDNUMSUB (see functions.lua)."""
    assert _PUBLISH in LIBRARY and _NUMSUB in LIBRARY
    if not cluster:
        return LIBRARY
    return LIBRARY.replace(_PUBLISH, _PUBLISH.replace("'PUBLISH'", "'SPUBLISH'")).replace(
        _NUMSUB, _NUMSUB.replace("'NUMSUB'", "'SHARDNUMSUB'"))


def translate(message: str) -> Exception:
    """NOTFOUND/CONFLICT/EXISTS/FULL replies become RpcErrors, LOADING and the like BusyLoadingError (a
    ConnectionError: the backend is unavailable); anything else stays a Redis error."""
    word, _, text = message.partition(" ")
    if word == "FULL":  # `FULL <reason> <detail>`: a bound was reached, -32009 with data.reason (one of Reason)
        reason, _, detail = text.partition(" ")
        return Conflict(f"{reason.replace('_', ' ')}: {detail}", {"reason": reason})
    if word in _NOT_ANSWERING:  # Redis is up but cannot serve yet: unavailable (-32050), retried by clients
        return BusyLoadingError(message)
    error = _ERRORS.get(word)
    return error(text) if error else ResponseError(message)


# A Redis loading its data, running a long script, a replica without its primary, or a cluster that lost
# a slot's primary (CLUSTERDOWN) or is migrating a slot (TRYAGAIN).
_NOT_ANSWERING = frozenset({"LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN"})
