"""JSON-RPC methods of coordination (presence.*, lease.*, mailbox.*, hook.answer) and their params, declared in
api/.

What coordination does around other methods (activity, presence moves, fencing, conflict alerts, the
graph version) is in steps.py.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

import pydantic_core
from pydantic import (
    AfterValidator,
    Field,
    JsonValue,
    StringConstraints,
    model_validator,
)

from memento_sessions.auth import MAX_ROLES, ROLE
from memento_sessions.coordination.answers import HookAnswers
from memento_sessions.coordination.hook_text import notice
from memento_sessions.coordination.service import Coordination
from memento_sessions.rpc import Call, Result
from memento_sessions.sessions.checks import value_problem
from memento_sessions.sessions.methods import Params, SessionParams
from memento_sessions.sessions.models import MAX_DATA_BYTES, ClientId, EntityId, Seq, ShortText, client_id

RoleName = Annotated[str, StringConstraints(pattern=ROLE.pattern)]
AGENT = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def check_recipient(value: str) -> str:
    """`role:<name>`, `session:<id>` or an agent id. What starts `role:` or `session:` is always read as one, so
    `role:`, `role:a:b` or a role name over 64 characters is an error, never an agent of that odd name."""
    kind, colon, name = value.partition(":")
    if colon and kind == "role":
        if not ROLE.fullmatch(name):
            raise ValueError("role:<name> needs a name of [A-Za-z0-9._-], 1..64 characters")
    elif colon and kind == "session":
        if not AGENT.fullmatch(name):
            raise ValueError("session:<id> needs an id of [A-Za-z0-9._:-], 1..128 characters")
    elif not AGENT.fullmatch(value):
        raise ValueError("an agent id is [A-Za-z0-9._:-], 1..128 characters")
    return value


Recipient = Annotated[str, AfterValidator(check_recipient)]


def check_body(value: JsonValue) -> JsonValue:
    """A message body is stored JSON like an event's data: finite numbers, clean text, at most 16 KiB."""
    problem = value_problem(value, "body")
    size = len(pydantic_core.to_json(value)) if problem is None else 0
    if problem or size > MAX_DATA_BYTES:
        raise ValueError(problem or f"body is larger than {MAX_DATA_BYTES} bytes encoded")
    return value


class RolesParams(Params):
    roles: list[RoleName] = Field(max_length=MAX_ROLES)


class AcquireParams(Params):
    entityIds: list[EntityId] = Field(min_length=1, max_length=64)
    ttl: int = Field(ge=5, le=3600)
    mode: Literal["exclusive", "shared", "intent"] = "exclusive"
    sessionId: ClientId | None = None
    reason: ShortText | None = None


class RenewParams(Params):
    leaseId: ClientId
    ttl: int = Field(ge=5, le=3600)


class ReleaseParams(Params):
    leaseId: ClientId


class ListLeasesParams(Params):
    entityId: EntityId | None = None
    agentId: ClientId | None = None
    cursor: ClientId | None = None  # a previous page's nextCursor
    limit: int = Field(default=100, ge=1, le=1000)

    @model_validator(mode="after")
    def _one_filter(self) -> ListLeasesParams:
        if self.entityId is not None and self.agentId is not None:
            raise ValueError("give entityId or agentId, not both")
        return self


class SendParams(Params):
    to: Recipient
    subject: ShortText | None = None
    body: Annotated[JsonValue, AfterValidator(check_body)]
    ttl: int | None = Field(default=None, ge=60, le=30 * 86400)
    id: Annotated[ClientId, AfterValidator(client_id)] | None = None  # never one of the daemon's own alert ids


class ReadParams(Params):
    since: Seq = 0
    limit: int = Field(default=100, ge=1, le=1000)
    unreadOnly: bool = False


class AckParams(Params):
    messageIds: list[ClientId] = Field(min_length=1, max_length=1000)


class StatusParams(Params):
    messageId: ClientId


class SurfaceParams(Params):
    limit: int = Field(default=20, ge=1, le=100)


class HookParams(Params):
    input: JsonValue  # Claude Code's hook input as it came: anything malformed is answered `{}` and counted
    root: Annotated[str, StringConstraints(min_length=1, max_length=4096)] | None = None  # the project root
    leases: Literal["off", "warn", "enforce"] | None = None  # the lease policy (default MEMENTO_HOOK_LEASES)
    claimTtl: int | None = Field(default=None, ge=0, le=3600)  # an edit's claim (default MEMENTO_HOOK_CLAIM_TTL)


class CoordinationMethods:
    """presence.*, lease.*, mailbox.* and hook.answer over the Coordination service."""

    def __init__(self, coord: Coordination) -> None:
        self.coord = coord
        self.answers = HookAnswers(coord)

    async def presence_get(self, call: Call, p: SessionParams) -> Result:
        return {"agents": await self.coord.presence.agents(call.identity.namespace, p.sessionId)}

    async def presence_set(self, call: Call, p: RolesParams) -> Result:
        return await self.coord.presence.set_roles(call.identity, p.roles)

    async def acquire(self, call: Call, p: AcquireParams) -> Result:
        return await self.coord.acquire(call.identity, p.entityIds, p.ttl, p.mode, p.sessionId, p.reason)

    async def renew(self, call: Call, p: RenewParams) -> Result:
        return await self.coord.leases.renew(call.identity, p.leaseId, p.ttl)

    async def release(self, call: Call, p: ReleaseParams) -> Result:
        return await self.coord.leases.release(call.identity, p.leaseId)

    async def list_leases(self, call: Call, p: ListLeasesParams) -> Result:
        return await self.coord.leases.listed(call.identity.namespace, p.entityId, p.agentId, p.cursor, p.limit)

    async def send(self, call: Call, p: SendParams) -> Result:
        return await self.coord.mailbox.send(call.identity, p.to, p.body, p.subject, p.ttl, p.id)

    async def read(self, call: Call, p: ReadParams) -> Result:
        return await self.coord.mailbox.read(call.identity, p.since, p.limit, p.unreadOnly)

    async def ack(self, call: Call, p: AckParams) -> Result:
        return await self.coord.mailbox.ack(call.identity, p.messageIds)

    # What brings the swarm back into an agent's context: receipts, notices, the hooks' answers.
    async def status(self, call: Call, p: StatusParams) -> Result:
        return await self.coord.mailbox.receipts.status(call.identity, p.messageId)

    async def surface(self, call: Call, p: SurfaceParams) -> Result:
        return {"notices": [notice(message) for message in await self.coord.mailbox.surface(call.identity, p.limit)]}

    async def hook_answer(self, call: Call, p: HookParams) -> Result:
        return {"output": await self.answers.answer(call.identity, p.input, p.root, p.leases, p.claimTtl)}
