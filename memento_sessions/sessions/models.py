"""The event and session shapes of the API, with their limits.

Field names are the wire's camelCase, so a model dumps to exactly what clients send and receive.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

import pydantic_core
from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictInt,
    StringConstraints,
    ValidationInfo,
    field_validator,
)

from memento_sessions.sessions.checks import (
    MAX_MAGNITUDE,
    NoControl,
    check_number,
    check_text,
    surely_storable,
    value_problem,
)

ClientId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._:-]{1,128}$")]
EntityId = Annotated[str, StringConstraints(min_length=1, max_length=256), NoControl]
EventType = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_.:-]{0,63}$")]
ShortText = Annotated[str, StringConstraints(max_length=256), AfterValidator(check_text)]
Number = Annotated[float, AfterValidator(check_number)]  # finite, |x| <= 1e12: FalkorDB and JSONB store it
# A seq a client names (since, atSeq): never over 1e12, and strict wherever it is used (MCP tools too)
Seq = Annotated[StrictInt, Field(ge=0, le=int(MAX_MAGNITUDE))]


def iso_text(value: Any) -> Any:
    """A timestamp arrives as ISO-8601 text (or a datetime from Python): never a number read as epoch seconds."""
    if not isinstance(value, str | datetime):
        raise ValueError("must be an ISO-8601 string")
    return value


# Strict mode takes no text for a datetime, so this one field parses its text itself (and nothing else).
Timestamp = Annotated[AwareDatetime, Field(strict=False), BeforeValidator(iso_text)]
State = Literal["working", "broken"]
SessionState = Literal["working", "broken", "coordinating", "completed"]

MAX_EVENT_BYTES = 64 * 1024
MAX_DATA_BYTES = 16 * 1024
MAX_BATCH = 500
KNOWN_TYPES = frozenset({"start", "modified", "broke", "test_pass", "checkpoint", "handoff"})
# The daemon's own records and alerts: event types only it emits, and the prefix of its ids (a conflict alert is
# `conflict:<sessionId>:<seq>:<leaseId>` in a mailbox, `conflict-<seq>` in a session). A client's event or message
# may use neither, so no agent can pre-empt (and so suppress) an alert or forge a record the dashboard draws.
SYSTEM_TYPES = frozenset({"conflict"})
SYSTEM_ID_PREFIXES = ("conflict:", "conflict-", "outcome:")
SYSTEM = {"system": True}  # the validation context of an event the daemon makes itself


def client_id(value: str | None) -> str | None:
    """An id a client may use: none of the daemon's own (SYSTEM_ID_PREFIXES)."""
    if value is not None and value.startswith(SYSTEM_ID_PREFIXES):
        raise ValueError(f"ids starting {' or '.join(SYSTEM_ID_PREFIXES)} are the daemon's own")
    return value


STATE_OF_TYPE = {"broke": "broken", "test_pass": "working"}  # the state an event type sets without a stateTransition


class Strict(BaseModel):
    """Unknown fields are errors, so a typo never passes silently; JSON types are taken as sent (no `"5"` -> 5)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False, strict=True)


class ChangeInfo(Strict):
    elementType: ShortText | None = None
    entityIds: list[EntityId] = Field(default_factory=list, max_length=256)
    operation: Literal["added", "modified", "deleted", "renamed", "init"] | None = None
    affectedLines: int | None = Field(default=None, ge=0, le=int(MAX_MAGNITUDE))
    semanticHash: ShortText | None = None


class StateTransition(Strict):
    from_: State | None = Field(default=None, alias="from")
    to: State
    verifiedBy: Literal["test", "build", "manual", "agent"] | None = None
    confidence: float | None = Field(default=None, ge=0.0, le=1.0)


class Impact(Strict):
    severity: Literal["low", "medium", "high", "critical"] | None = None
    testsFailed: list[EntityId] = Field(default_factory=list, max_length=256)
    perfDelta: Number | None = None
    externalRef: ShortText | None = None


class EncodedData(dict[str, Any]):
    """An event's `data` as validated, with its JSON: encoded once to check its size, that encoding is what
    the stored event carries (sessions/manager.py event_body). Nothing changes a validated event's data in
    place; a new value assigned is a plain dict, encoded again."""

    __slots__ = ("encoded",)

    def __init__(self, value: dict[str, Any], encoded: bytes) -> None:
        super().__init__(value)
        self.encoded = encoded


class EventIn(Strict):
    """An event as a client sends it."""

    id: ClientId | None = None
    type: EventType
    timestamp: Timestamp | None = None
    actor: ClientId | None = None
    changeInfo: ChangeInfo | None = None
    stateTransition: StateTransition | None = None
    impact: Impact | None = None
    data: dict[str, Any] | None = None
    # The fencing token of the lease the actor holds on changeInfo.entityIds (docs/coordination.md): an
    # older one than the newest grant on one of them is refused by the emit Function (stale_lease).
    fencingToken: int | None = Field(default=None, ge=1, le=int(MAX_MAGNITUDE))

    @field_validator("id")
    @classmethod
    def _client_id(cls, value: str | None, info: ValidationInfo) -> str | None:
        return value if info.context == SYSTEM else client_id(value)

    @field_validator("type")
    @classmethod
    def _client_type(cls, value: str, info: ValidationInfo) -> str:
        if value in SYSTEM_TYPES and info.context != SYSTEM:
            raise ValueError(f"type {value!r} is the daemon's own")
        return value

    @field_validator("data")
    @classmethod
    def _data_size(cls, value: dict[str, Any] | None) -> EncodedData | None:
        if value is None:
            return None
        # NaN would poison every later reader: encoded as the word, not silently as null, until refused.
        encoded = pydantic_core.to_json(value, inf_nan_mode="constants")
        problem = None if surely_storable(value, encoded) else value_problem(value, "data")
        if problem:
            raise ValueError(problem)
        if len(encoded) > MAX_DATA_BYTES:
            raise ValueError(f"data is larger than {MAX_DATA_BYTES} bytes encoded")
        return EncodedData(value, encoded)

    def new_state(self) -> str:
        """The session state this event sets ('' when it sets none)."""
        if self.stateTransition is not None:
            return self.stateTransition.to
        return STATE_OF_TYPE.get(self.type, "")


class SessionInfo(BaseModel):
    """A session as clients see it."""

    sessionId: str
    state: SessionState
    agentIds: list[str]
    seq: int
    epoch: str
    createdAt: datetime
    updatedAt: datetime
    expiresAt: datetime
    lastCheckpoint: dict[str, Any] | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    parentSessionId: str | None = None
    forkedAtSeq: int | None = None
