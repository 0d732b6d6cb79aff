"""The methods over the knowledge graph, declared: session.checkpoint, kg.upsert and bridge.* (bridge.commit too)."""

from __future__ import annotations

from memento_sessions.api.args import (
    AgentId,
    ClusterId,
    Days,
    EntityFilter,
    Final,
    IsolateLimit,
    IsolateSince,
    SessionId,
)
from memento_sessions.api.spec import KG_WRITE, READ, WRITE, Arg, Declared, Tool
from memento_sessions.api.steps import graph_write, handoff
from memento_sessions.bridge.methods import (
    CommitParams,
    HandoffParams,
    IsolateParams,
    OutcomesParams,
    TransitionsParams,
)
from memento_sessions.checkpoints.methods import CheckpointParams
from memento_sessions.client.results import (
    Checkpoint,
    Commit,
    Handoff,
    Isolated,
    Outcomes,
    Transitions,
    Upserted,
)
from memento_sessions.kg.loader import UpsertParams

GRAPH: tuple[Declared, ...] = (
    Declared(
        "session.checkpoint",
        CheckpointParams,
        Checkpoint,
        WRITE,
        lambda s: s.checkpoints.checkpoint,
        "Summarise the events since the last checkpoint and anchor them on the graph.",
        tools=(
            Tool(
                "checkpoint_session",
                5,
                "write",
                (
                    Arg("sessionId", SessionId),
                    Arg("final", Final, False),
                ),
                """Summarise the events since the previous checkpoint and anchor the summary on the knowledge graph;
                call it at a milestone, and with final=true when the task is done (the session is then completed).
                A broken outcome also keeps every event of the session for later debugging. Returns the checkpoint
                id, its outcome (the session state), whether it broke during the window, the key impacts, the
                summed perfDelta, the actors and the entity ids touched.""",
            ),
        ),
    ),
    Declared(
        "kg.upsert",
        UpsertParams,
        Upserted,
        KG_WRITE,
        lambda s: s.graph.upsert,
        "Create or update knowledge-graph nodes and edges.",
        steps=(graph_write,),
    ),
    Declared(
        "bridge.transitions",
        TransitionsParams,
        Transitions,
        READ,
        lambda s: s.bridge.transitions,
        "A session's working/broken transitions with their graph context.",
        tools=(
            Tool(
                "get_transitions",
                6,
                "read",
                (
                    Arg("sessionId", SessionId),
                    Arg("entityId", EntityFilter, None),
                ),
                """Find when a session's code went from working to broken and back, to see which change broke
                something and which fixed it. Optionally restrict to one entity. Returns each transition's
                fromSeq and toSeq, the changeInfo and impact of the events involved, and, when known, the
                surrounding knowledge-graph context. Works after the session expired, from its checkpoint anchors.""",
            ),
        ),
    ),
    Declared(
        "bridge.isolate",
        IsolateParams,
        Isolated,
        READ,
        lambda s: s.bridge.isolate,
        "One agent's events and impact in a session.",
        tools=(
            Tool(
                "isolate_session",
                7,
                "read",
                (
                    Arg("sessionId", SessionId),
                    Arg("agentId", AgentId),
                    Arg("since", IsolateSince, 0),
                    Arg("limit", IsolateLimit, None),
                ),
                """Separate one agent's contribution from the rest of a shared session, e.g. to judge or undo its
                work. Returns a page of that agent's events (at most {page}, fewer when events are large), the entities
                it touched with their recent anchors and counts, and the total perfDelta it caused (those two always
                cover all its events). When the reply has nextSince, the agent has more events: call again with
                since=nextSince, until a reply has no nextSince.""",
            ),
        ),
    ),
    Declared(
        "bridge.handoff",
        HandoffParams,
        Handoff,
        READ,
        handoff,
        "What to know before taking a session over, with its leases, open conflicts and freshness.",
        tools=(
            Tool(
                "get_handoff_context",
                8,
                "read",
                (Arg("sessionId", SessionId),),
                """Everything you need before taking over or joining someone else's session: call it first, then
                join_session. Returns the session's state and agents, its last 10 changes, the knowledge-graph
                context of the entities involved (related entities and their latest anchor) and a few sentences of
                advice (e.g. fix the breakage first when it is broken). Works after the session expired, rebuilt from
                its checkpoint anchors and failure snapshot.""",
            ),
        ),
    ),
    Declared(
        "bridge.outcomes",
        OutcomesParams,
        Outcomes,
        READ,
        lambda s: s.bridge.outcomes,
        "How recent work on a semantic cluster went.",
        tools=(
            Tool(
                "session_outcomes",
                9,
                "read",
                (
                    Arg("clusterId", ClusterId),
                    Arg("days", Days, None),
                ),
                """How work on one semantic cluster of the codebase has gone lately, to estimate the risk of
                touching it. Returns the cluster's name, the titles of the specs it implements, the recent
                sessions anchored on it, their average perfDelta and how many ended broken.""",
            ),
        ),
    ),    Declared(
        "bridge.commit",
        CommitParams,
        Commit,
        READ,
        lambda s: s.bridge.commit,
        "The session that produced a commit, by its SHA or a prefix of it.",
    ),
)
