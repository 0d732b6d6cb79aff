"""The coordination methods, declared: presence.*, lease.*, mailbox.* and hook.answer."""

from __future__ import annotations

from typing import Any

from memento_sessions.api.args import (
    Body,
    CoordinationSessionId,
    InboxLimit,
    InboxSince,
    LeaseAgent,
    LeaseCursor,
    LeaseEntity,
    LeaseEntityIds,
    LeaseId,
    LeaseLimit,
    LeaseReason,
    LeaseSession,
    LeaseTtl,
    MessageId,
    MessageIds,
    MessageSubject,
    MessageTtl,
    Mode,
    RenewTtl,
    SentId,
    TaskId,
    To,
    UnreadOnly,
)
from memento_sessions.api.spec import READ, WRITE, Arg, Declared, Tool
from memento_sessions.client.results import (
    Acked,
    Here,
    HookAnswer,
    Inbox,
    Lease,
    LeaseList,
    Notices,
    Receipt,
    Released,
    Renewed,
    Roles,
    Sent,
)
from memento_sessions.coordination.methods import (
    AckParams,
    AcquireParams,
    HookParams,
    ListLeasesParams,
    ReadParams,
    ReleaseParams,
    RenewParams,
    RolesParams,
    SendParams,
    StatusParams,
    SurfaceParams,
)
from memento_sessions.sessions.methods import SessionParams


def task_lease(arguments: dict[str, Any]) -> dict[str, Any]:
    """claim_task's arguments as lease.acquire's params: an exclusive lease on the entity 'task:<taskId>'."""
    rest = {name: value for name, value in arguments.items() if name != "taskId"}
    return {"entityIds": [f"task:{arguments['taskId']}"], "mode": "exclusive", **rest}


COORDINATION: tuple[Declared, ...] = (
    Declared(
        "presence.get",
        SessionParams,
        Here,
        READ,
        lambda s: s.coordination.presence_get,
        "The agents present in a session.",
        tools=(
            Tool(
                "who_is_here",
                11,
                "read",
                (Arg("sessionId", CoordinationSessionId),),
                """See which agents are in a session right now before you start work in it: each agent's id, whether
                it is 'active' (made a request lately) or 'idle', when it was last seen and how many connections it
                has (0 for an agent working through these tools, the hook or ingest: it is listed for a while after it
                joined or emitted there, until it leaves). An agent whose connections all closed or whose daemon died is
                not listed.""",
            ),
        ),
    ),
    Declared(
        "presence.set", RolesParams, Roles, WRITE, lambda s: s.coordination.presence_set, "Declare the caller's roles."
    ),
    Declared(
        "lease.acquire",
        AcquireParams,
        Lease,
        WRITE,
        lambda s: s.coordination.acquire,
        "Lease entities, exclusive or shared, with a fencing token; or declare an intent (holds nothing).",
        tools=(
            Tool(
                "acquire_lease",
                12,
                "write",
                (
                    Arg("entityIds", LeaseEntityIds),
                    Arg("ttl", LeaseTtl),
                    Arg("mode", Mode, "exclusive"),
                    Arg("sessionId", LeaseSession, None),
                    Arg("reason", LeaseReason, None),
                ),
                """Acquire a lease before editing a file, symbol or cluster that other agents may touch. A lease on a
                file also covers the symbols it defines, a cluster its members. Exclusive is all or nothing: if
                another agent holds any of them, granted is false and conflicts names each holder, its leaseId and
                'via' (the file or cluster the conflict came through); wait, pick other work or message the holder.
                Shared is advisory. Keep the fencingToken and put it on the events you emit for those entities:
                an event with an older token than a newer grant is refused (stale_lease). Renew before expiresAt.""",
            ),
            Tool(
                "claim_task",
                13,
                "write",
                (
                    Arg("taskId", TaskId),
                    Arg("ttl", LeaseTtl),
                    Arg("sessionId", LeaseSession, None),
                    Arg("reason", LeaseReason, None),
                ),
                """Claim a task before you start it, so no other agent takes it too: an exclusive lease on
                'task:<taskId>'. Exactly one of any agents racing for it gets granted true; the others get granted
                false and conflicts naming the holder: pick another task. Keep the fencingToken: the task's
                completion event (type 'task_done', changeInfo.entityIds ['task:<taskId>']) must carry it as
                fencingToken, or it is refused (stale_lease). Renew before expiresAt while you work; release it if
                you give the task up.""",
                params=task_lease,
            ),
        ),
    ),
    Declared(
        "lease.renew",
        RenewParams,
        Renewed,
        WRITE,
        lambda s: s.coordination.renew,
        "Extend a lease the caller holds.",
        tools=(
            Tool(
                "renew_lease",
                14,
                "idempotent",
                (
                    Arg("leaseId", LeaseId),
                    Arg("ttl", RenewTtl),
                ),
                """Extend a lease you hold while you are still working on its entities; it then ends ttl seconds from
                now. Fails with not found (-32004) when it already ended (expired, released, or you were gone too
                long).""",
            ),
        ),
    ),
    Declared(
        "lease.release",
        ReleaseParams,
        Released,
        WRITE,
        lambda s: s.coordination.release,
        "Release a lease the caller holds.",
        tools=(
            Tool(
                "release_lease",
                15,
                "idempotent",
                (Arg("leaseId", LeaseId),),
                """Release a lease as soon as you are done with its entities, so other agents can take them. Do it
                when your edit is committed or abandoned, not at the end of your whole task: an exclusive lease you
                forget blocks everyone else until its TTL runs out. Only the agent that acquired the lease can
                release it.""",
            ),
        ),
    ),
    Declared(
        "lease.list",
        ListLeasesParams,
        LeaseList,
        READ,
        lambda s: s.coordination.list_leases,
        "A page of live leases, by entity, agent or all.",
        tools=(
            Tool(
                "list_leases",
                16,
                "read",
                (
                    Arg("entityId", LeaseEntity, None),
                    Arg("agentId", LeaseAgent, None),
                    Arg("cursor", LeaseCursor, None),
                    Arg("limit", LeaseLimit, 100),
                ),
                """List live leases: those covering one entity, those of one agent, or all of your namespace. Each has
                its leaseId, agentId, mode, entityIds, covers (entities held through the graph), fencingToken and
                expiresAt. When the reply has nextCursor, call again with cursor=nextCursor for the rest.""",
            ),
        ),
    ),
    Declared(
        "mailbox.send",
        SendParams,
        Sent,
        WRITE,
        lambda s: s.coordination.send,
        "Send a message to an agent, a role or a session's agents.",
        tools=(
            Tool(
                "send_message",
                17,
                "write",
                (
                    Arg("to", To),
                    Arg("body", Body),
                    Arg("subject", MessageSubject, None),
                    Arg("ttl", MessageTtl, None),
                    Arg("id", MessageId, None),
                ),
                """Send a message to another agent, to every agent with a role, or to every agent of a session: a
                follow-up, a question to a lease holder, a handoff note. A connected recipient gets it at once; an
                absent one finds it in its inbox. Returns the messageId and the recipients.""",
            ),
        ),
    ),
    Declared(
        "mailbox.read",
        ReadParams,
        Inbox,
        READ,
        lambda s: s.coordination.read,
        "A page of the caller's messages, oldest first.",
        tools=(
            Tool(
                "read_inbox",
                18,
                "read",
                (
                    Arg("since", InboxSince, 0),
                    Arg("limit", InboxLimit, 100),
                    Arg("unreadOnly", UnreadOnly, False),
                ),
                """Read your messages, oldest first, including lease conflict alerts (subject 'lease.conflict'): call it
                when you start or resume work. Each has seq, messageId, from, subject, body, sentAt and read. When the
                reply has nextSince, call again with since=nextSince. Acknowledge what you handled with
                ack_messages.""",
            ),
        ),
    ),
    Declared(
        "mailbox.ack",
        AckParams,
        Acked,
        WRITE,
        lambda s: s.coordination.ack,
        "Mark messages read.",
        tools=(
            Tool(
                "ack_messages",
                19,
                "idempotent",
                (Arg("messageIds", MessageIds),),
                """Mark messages as read once you handled them, so read_inbox with unreadOnly skips them. Pass the
                messageIds you got from read_inbox or from a mailbox notification; acking is idempotent, and an id
                you do not have is ignored. Unacked messages stay until their TTL, so ack what you acted on.""",
            ),
        ),
    ),    Declared(
        "mailbox.status",
        StatusParams,
        Receipt,
        READ,
        lambda s: s.coordination.status,
        "How far a message the caller sent has got, per recipient.",
        tools=(
            Tool(
                "message_status",
                20,
                "read",
                (Arg("messageId", SentId),),
                """See how far a message you sent has got, per recipient: when it was stored in their mailbox, pushed
                to a live connection of theirs, surfaced in their context (a hook or a tool's notices) and acked. A
                stage not reached yet is null. Fails with not found (-32004) for a message you did not send or that
                expired.""",
            ),
        ),
    ),
    Declared(
        "mailbox.surface",
        SurfaceParams,
        Notices,
        WRITE,
        lambda s: s.coordination.surface,
        "The caller's unacked messages and alerts not surfaced yet, each once (every MCP tool result's notices).",
    ),
    Declared(
        "hook.answer",
        HookParams,
        HookAnswer,
        WRITE,
        lambda s: s.coordination.hook_answer,
        "The answer to an agent's hook (Claude Code, Gemini CLI): context, what is new, edit claims.",
    ),
)
