"""The session methods, declared: session.create|join|leave|get|list, event.emit|emitBatch, the subscriptions
and session.conversation. session.create, .get and .list are the lifecycle's variants (onIdle, atSeq, status)."""

from __future__ import annotations

from memento_sessions.api.args import (
    AgentFilter,
    AtSeq,
    BlockCursor,
    BlockLimit,
    Condensed,
    Cursor,
    EntityIds,
    Event,
    Labels,
    LifecycleSessionId,
    Limit,
    ListLimit,
    NewSessionId,
    SessionId,
    Since,
    StateFilter,
    SubagentId,
    Ttl,
)
from memento_sessions.api.spec import READ, WRITE, Arg, Declared, Tool
from memento_sessions.api.steps import (
    fenced_batch,
    fenced_emit,
    note_commits,
    outcome,
    presence_enter,
    presence_exit,
    usage_fold,
    usage_fold_batch,
    visit,
)
from memento_sessions.client.results import (
    AtView,
    Conversation,
    Created,
    Emitted,
    EmittedBatch,
    Empty,
    Joined,
    SessionDetail,
    SessionList,
    Subscribed,
)
from memento_sessions.lifecycle.methods import CreateIdleParams, GetAtParams, ListStatusParams
from memento_sessions.sessions.conversation import ConversationParams
from memento_sessions.sessions.methods import EmitBatchParams, EmitParams, Params, SessionParams, SubscribeParams

SESSIONS: tuple[Declared, ...] = (
    Declared(
        "session.create",
        CreateIdleParams,
        Created,
        WRITE,
        lambda s: s.lifecycle.create,
        "A new session with the caller as its first agent (onIdle: expire or suspend).",
        tools=(
            Tool(
                "create_session",
                0,
                "write",
                (
                    Arg("entityIds", EntityIds, None),
                    Arg("sessionId", NewSessionId, None),
                    Arg("ttl", Ttl, None),
                    Arg("labels", Labels, None),
                ),
                """Start a new shared work session with you as its first agent. Call it when you begin a task that
                other agents may watch or take over. Pass the codebase entity ids you are about to work on
                (a 'start' event naming them becomes seq 1) and optional labels. Returns the sessionId to use in
                every other tool, its state ('working'), its current seq, its agentIds and when it expires.""",
            ),
        ),
    ),
    Declared(
        "session.join",
        SessionParams,
        Joined,
        WRITE,
        lambda s: s.sessions.join,
        "Add the caller to a session's agents.",
        steps=(
            visit,
            presence_enter,
        ),
        tools=(
            Tool(
                "join_session",
                1,
                "idempotent",
                (Arg("sessionId", SessionId),),
                """Add yourself to an existing session's agents, before emitting into it or taking it over.
                Joining twice is harmless. Returns the sessionId, every agent in it, its state ('working',
                'broken', 'coordinating' or 'completed') and its current seq (the number of events so far).""",
            ),
        ),
    ),
    Declared(
        "session.leave",
        SessionParams,
        Empty,
        WRITE,
        lambda s: s.sessions.leave,
        "Remove the caller from a session's agents.",
        steps=(presence_exit,),
    ),
    Declared(
        "session.get",
        GetAtParams,
        SessionDetail,
        READ,
        lambda s: s.lifecycle.get,
        "A session with a page of its events, its condensed view, or its state at atSeq.",
        tools=(
            Tool(
                "get_session",
                3,
                "read",
                (
                    Arg("sessionId", SessionId),
                    Arg("condensed", Condensed, False),
                    Arg("since", Since, 0),
                    Arg("limit", Limit, None),
                ),
                """Read a session: its state, agents, seq, labels and last checkpoint, plus a page of its events in seq
                order (at most {page}, fewer when events are large). When the reply has nextSince, more events exist:
                call again with since=nextSince, and repeat until a reply has no nextSince. To read only what is new,
                pass the last seq you saw as since. Or ask condensed=true for a summary of every event in one reply:
                event counts by type, the entities touched with their counts, every working/broken transition, the
                summed perfDelta and the last checkpoint (truncated names any list that was cut to its first {kept}).
                Fails with not found (-32004) when the session does not exist in your namespace or has expired.""",
            ),
            Tool(
                "get_session_at",
                21,
                "read",
                (
                    Arg("sessionId", LifecycleSessionId),
                    Arg("atSeq", AtSeq),
                ),
                """See a session as it was right after one event (time travel): its state (working or broken), the
                agents that had emitted, event counts by type, entities touched, transitions and summed perfDelta,
                exactly as the live condensed view would have shown them then. Use it to find out what the session
                looked like before a change broke it. Fails with invalid params (-32602) when atSeq is beyond the
                session's seq, and with conflict (-32009, reason compacted) when those events were compacted away.""",
                result=AtView,
            ),
        ),
    ),
    Declared(
        "session.list",
        ListStatusParams,
        SessionList,
        READ,
        lambda s: s.lifecycle.list_,
        "A page of the namespace's sessions, newest first.",
        tools=(
            Tool(
                "list_sessions",
                4,
                "read",
                (
                    Arg("state", StateFilter, None),
                    Arg("agentId", AgentFilter, None),
                    Arg("limit", ListLimit, None),
                    Arg("cursor", Cursor, None),
                ),
                """List the live sessions of your namespace, newest first, to find work to join or check on. Filter by
                state ('working', 'broken', 'coordinating', 'completed') or by an agent that joined them. Returns
                each session's id, state, agents, seq, labels, timestamps and last checkpoint. A reply holds one page
                ({list_page} sessions unless you pass limit); when it has nextCursor, more may follow: call again with
                cursor=nextCursor and the same filters, until a reply has no nextCursor. A page can be short, even
                empty, and still have a nextCursor when a filter skipped many sessions.""",
            ),
        ),
    ),
    Declared(
        "event.emit",
        EmitParams,
        Emitted,
        WRITE,
        lambda s: s.sessions.emit,
        "Store one event of a session and publish it.",
        steps=(
            outcome,
            fenced_emit,
            visit,
            note_commits,
            usage_fold,
        ),
        tools=(
            Tool(
                "emit_event",
                2,
                "write",
                (
                    Arg("sessionId", SessionId),
                    Arg("event", Event),
                ),
                """Record one thing that happened in a session: call it after every meaningful change. Give the event
                a type ('modified', 'broke', 'test_pass', 'checkpoint', 'handoff' or your own), and where it
                applies changeInfo (entityIds, operation), stateTransition (from/to working|broken), impact
                (severity, testsFailed, perfDelta) and free-form data. 'broke' marks the session broken, 'test_pass'
                working. Set event.id to make retries safe: the same id returns the same seq with duplicate=true
                and writes nothing. The actor is always you. Returns the event's seq and whether it was a duplicate.""",
            ),
        ),
    ),
    Declared(
        "event.emitBatch",
        EmitBatchParams,
        EmittedBatch,
        WRITE,
        lambda s: s.sessions.emit_batch,
        "Store several events of a session at once, all or none.",
        steps=(
            outcome,
            fenced_batch,
            visit,
            note_commits,
            usage_fold_batch,
        ),
    ),
    Declared(
        "session.subscribe",
        SubscribeParams,
        Subscribed,
        READ,
        lambda s: s.subscriptions.subscribe,
        "Replay a session's events after `since`, then receive them live (WebSocket only).",
        steps=(presence_enter,),
    ),
    Declared(
        "session.unsubscribe",
        SessionParams,
        Empty,
        READ,
        lambda s: s.subscriptions.unsubscribe,
        "Stop a subscription (WebSocket only).",
        steps=(presence_exit,),
    ),
    Declared(
        "sessions.watch",
        Params,
        Empty,
        READ,
        lambda s: s.subscriptions.watch,
        "Receive the namespace's session announcements (WebSocket only).",
    ),
    Declared(
        "session.conversation",
        ConversationParams,
        Conversation,
        READ,
        lambda s: s.conversation.conversation,
        "A page of an ingested agent's conversation blocks.",
        tools=(
            Tool(
                "get_conversation",
                10,
                "read",
                (
                    Arg("sessionId", SessionId),
                    Arg("subagentId", SubagentId, None),
                    Arg("cursor", BlockCursor, 0),
                    Arg("limit", BlockLimit, None),
                ),
                """Read what an agent said and did in a session recorded from its transcript or hooks (Claude Code,
                the Agent SDK, OpenCode): the conversation as ordered blocks (user_message, assistant_text, thinking,
                tool_use with its input and result, system), each with its status (pending while streaming,
                complete), and the subagents it spawned with their status and result. A reply holds one page of
                blocks of the main conversation, or of one subagent's when you pass its subagentId; when it has
                nextCursor, call again with cursor=nextCursor. blockCount is the thread's total. For the tools
                used, the user's prompts, the todo list and the tasks in one summary, call get_session with
                condensed=true. Fails with not found (-32004) when the session (or subagent) does not exist in
                your namespace.""",
            ),
        ),
    ),
)
