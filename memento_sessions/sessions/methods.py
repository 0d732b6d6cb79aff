"""JSON-RPC methods over the SessionManager: session.* and event.*."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

from memento_sessions.errors import InvalidParams
from memento_sessions.rpc import Call, Result
from memento_sessions.sessions.checks import check_text
from memento_sessions.sessions.manager import SessionManager
from memento_sessions.sessions.models import MAX_BATCH, ClientId, EntityId, EventIn, Seq, SessionState

LabelKey = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._:/-]{1,64}$")]
ListCursor = Annotated[str, StringConstraints(pattern=r"^[0-9]{1,16}:[A-Za-z0-9._:-]{1,128}$")]
LabelValue = Annotated[str, StringConstraints(max_length=256), AfterValidator(check_text)]


class Params(BaseModel):
    """Every method's params: unknown fields are errors and JSON types are taken as sent (strict): `"60"` is
    not 60, `true` not 1, `"yes"` not true; each is -32602 naming the field."""

    model_config = ConfigDict(extra="forbid", strict=True)


class CreateParams(Params):
    entityIds: list[EntityId] = Field(default_factory=list, max_length=256)
    sessionId: ClientId | None = None
    ttl: int | None = Field(default=None, ge=60, le=86400)
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=32)


class SessionParams(Params):
    sessionId: ClientId


class GetParams(SessionParams):
    condensed: bool = False
    since: Seq = 0
    limit: int | None = Field(default=None, ge=1, le=10_000)


class ListParams(Params):
    state: SessionState | None = None
    agentId: ClientId | None = None
    limit: int = Field(default=50, ge=1, le=500)
    cursor: ListCursor | None = None  # a previous page's nextCursor


class SubscribeParams(SessionParams):
    since: Seq | None = None
    epoch: str | None = Field(default=None, max_length=64)


class EmitParams(SessionParams):
    event: EventIn


class EmitBatchParams(SessionParams):
    events: list[EventIn] = Field(min_length=1, max_length=MAX_BATCH)


class SessionMethods:
    """`session.join|leave` and `event.emit|emitBatch`, and the plain `session.create|get|list` the lifecycle extends:
    each a thin call into the SessionManager."""

    def __init__(self, manager: SessionManager) -> None:
        self.manager = manager

    async def create(self, call: Call, p: CreateParams) -> Result:
        ttl_cap = self.manager.settings.session_ttl
        if p.ttl is not None and p.ttl > ttl_cap:
            raise InvalidParams("invalid params", [{"field": "ttl", "message": f"at most {ttl_cap} "
                                                    "(MEMENTO_SESSION_TTL)"}])
        return await self.manager.create(call.identity, entity_ids=p.entityIds, session_id=p.sessionId, ttl=p.ttl,
                                         labels=p.labels)

    async def join(self, call: Call, p: SessionParams) -> Result:
        return await self.manager.join(call.identity, p.sessionId)

    async def leave(self, call: Call, p: SessionParams) -> Result:
        await self.manager.leave(call.identity, p.sessionId)
        return {}

    async def get(self, call: Call, p: GetParams) -> Result:
        return await self.manager.get(call.identity.namespace, p.sessionId, condensed=p.condensed, since=p.since,
                                      limit=p.limit)

    async def list_(self, call: Call, p: ListParams) -> Result:
        return await self.manager.list_sessions(call.identity.namespace, state=p.state, agent_id=p.agentId,
                                                limit=p.limit, cursor=p.cursor)

    async def emit(self, call: Call, p: EmitParams) -> Result:
        done = await self.manager.emit(call.identity, p.sessionId, p.event)
        return {"seq": done.seq, "duplicate": done.duplicate}

    async def emit_batch(self, call: Call, p: EmitBatchParams) -> Result:
        done = await self.manager.emit_batch(call.identity, p.sessionId, p.events)
        result: dict[str, Any] = {"seqs": [item.seq for item in done]}
        if any(item.duplicate for item in done):
            result["duplicates"] = [item.seq for item in done if item.duplicate]
        return result
