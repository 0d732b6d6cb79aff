"""The answers to Claude Code's hooks: given the caller and one hook input, Claude Code's hook JSON output.

One implementation behind both forms: `memento-sessions hook` asks it with `hook.answer` over /ws, and
`POST /hooks/claude-code` calls it in the daemon. Each Claude Code session is its own agent,
`<token subject>:<session short id>` (session_agent): a token acts only as itself or its own sub-agents,
never as another agent or in another namespace.

- SessionStart: who else works in the namespace now (their leases, their last events), unread messages,
  and the session's own recent events when other agents worked in it before (a handoff).
- UserPromptSubmit, PostToolUse, PostToolUseFailure: what is new since the agent last surfaced (messages,
  conflict alerts), each item once (Mailbox.surface).
- PreToolUse of a file-editing tool: the lease policy (off, warn, enforce) on `file:<path from the project
  root>`, then the edit's short exclusive claim, taken or renewed.
- SessionEnd: the agent's claims released, its presence ended.
Anything malformed or unknown is allowed with an empty answer, writes nothing and is counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass
from typing import Any

from memento_sessions import keys
from memento_sessions.auth import SESSION_ID, Identity, session_agent
from memento_sessions.coordination.hook_text import event_line, fit, lease_line, message_line
from memento_sessions.coordination.service import Coordination
from memento_sessions.errors import NotFound
from memento_sessions.ingest.claude_hooks import HOOK_EVENTS
from memento_sessions.metrics import HOOK_ANSWERS
from memento_sessions.sessions.manager import SessionManager, iso
from memento_sessions.settings import Settings

Result = dict[str, Any]
EVENTS = frozenset(HOOK_EVENTS)
EDIT_TOOLS = frozenset({"Edit", "Write", "MultiEdit", "NotebookEdit"})
NEWS = frozenset({"UserPromptSubmit", "PostToolUse", "PostToolUseFailure"})
MAX_OTHERS = 8  # other agents a SessionStart describes (the rest counted)
MAX_LISTED = 100  # leases read per agent
PRESENT_REFRESH = 30.0  # seconds between two writes of an agent's presence by one daemon (at most)
MAX_PRESENT = 100_000  # agents whose last presence write a daemon remembers (all forgotten past it)


@dataclass(frozen=True, slots=True)
class HookInput:
    """The fields of a hook input an answer reads."""

    event: str
    session_id: str
    record: Result
    root: str | None


def parse(record: Any, root: str | None) -> HookInput | None:
    """The hook input, or None (counted as malformed or unknown_event) when it is not one this daemon answers."""
    if not isinstance(record, dict):
        HOOK_ANSWERS.labels("malformed").inc()
        return None
    event, session_id = record.get("hook_event_name"), record.get("session_id")
    if not isinstance(session_id, str) or not SESSION_ID.match(session_id) or not isinstance(event, str):
        HOOK_ANSWERS.labels("malformed").inc()
        return None
    if event not in EVENTS:
        HOOK_ANSWERS.labels("unknown_event").inc()
        return None
    cwd = record.get("cwd")
    return HookInput(event, session_id, record, root or (cwd if isinstance(cwd, str) and cwd else None))


def file_entity(hook: HookInput) -> str | None:
    """`file:<path relative to the project root>` of an editing tool's target, None for any other tool or a
    path outside the root."""
    tool_input = hook.record.get("tool_input")
    if hook.record.get("tool_name") not in EDIT_TOOLS or not isinstance(tool_input, dict):
        return None
    path = tool_input.get("file_path") or tool_input.get("notebook_path")
    if not isinstance(path, str) or not path or "\0" in path:
        return None
    root = hook.root or "/"
    relative = os.path.relpath(os.path.normpath(os.path.join(root, path)), root)
    if relative.startswith("..") or len(relative) > 250:
        return None
    return "file:" + relative.replace(os.sep, "/")


def presence_of(me: Identity, hook: HookInput) -> tuple[str, str]:
    """The agent's namespace and its member in hook_agents: `<agentId>|<sessionId>`."""
    return me.namespace, f"{me.agent_id}|{hook.session_id}"


def output(event: str, context: str | None = None, **decision: str) -> Result:
    """Claude Code's hook JSON output: `{}` (allowed, nothing to say) or its hookSpecificOutput."""
    if not context and not decision:
        return {}
    specific: Result = {"hookEventName": event, **decision}
    if context:
        specific["additionalContext"] = context
    return {"hookSpecificOutput": specific}


class HookAnswers:
    """Answers hook inputs over the coordination service and the session store."""

    def __init__(self, coord: Coordination) -> None:
        self.coord = coord
        self.manager: SessionManager = coord.manager
        self.settings: Settings = coord.settings
        # When each (namespace, member) of hook_agents is due to be written again: a tenth of the presence window
        # at most, so a hook call writes it once in that while, not at every tool call.
        self.refresh = min(PRESENT_REFRESH, self.settings.presence_visit / 10)
        self.written: dict[tuple[str, str], float] = {}

    async def answer(self, who: Identity, record: Any, root: str | None = None, policy: str | None = None,
                     claim_ttl: int | None = None) -> Result:
        """The hook output for one input (policy and claim_ttl default to MEMENTO_HOOK_LEASES / _CLAIM_TTL)."""
        hook = parse(record, root)
        if hook is None:
            return {}
        HOOK_ANSWERS.labels("answered").inc()
        me = session_agent(who, hook.session_id)
        if hook.event == "SessionEnd":
            await self.end(me, hook)
            return {}
        await self.coord.mailbox.remember(me)  # a lookup, but once an hour
        if self.due(me, hook):  # written while the answer is read: their commands go out together
            _, answered = await asyncio.gather(self.present(me, hook), self.respond(me, hook, policy, claim_ttl))
            return answered
        return await self.respond(me, hook, policy, claim_ttl)

    async def respond(self, me: Identity, hook: HookInput, policy: str | None, claim_ttl: int | None) -> Result:
        """The answer of a hook input other than SessionEnd."""
        if hook.event == "SessionStart":
            return output(hook.event, await self.start_context(me, hook))
        if hook.event in NEWS:
            return output(hook.event, await self.news(me))
        if hook.event == "PreToolUse":
            entity = file_entity(hook)
            if entity is not None:
                return await self.edit(me, hook, entity, policy or self.settings.hook_leases,
                                       self.settings.hook_claim_ttl if claim_ttl is None else claim_ttl)
        return {}

    def due(self, me: Identity, hook: HookInput) -> bool:
        """Whether the agent's presence is to be written: at a SessionStart, else when this daemon has not written
        it for `refresh` seconds. A namespace lists the agents of the last MEMENTO_PRESENCE_VISIT seconds, so a
        fresher time would change nothing it shows."""
        return hook.event == "SessionStart" or self.written.get(presence_of(me, hook), 0.0) <= time.monotonic()

    async def present(self, me: Identity, hook: HookInput) -> None:
        """The agent works in the namespace now (hook_agents, bounded)."""
        member, written = presence_of(me, hook), time.monotonic()
        agents, command = keys.hook_agents(me.namespace), self.coord.store.command
        await asyncio.gather(command("ZADD", agents, int(time.time() * 1000), member[1]),
                             command("ZREMRANGEBYRANK", agents, 0, -self.settings.hook_agents_max - 1),
                             command("EXPIRE", agents, 86400))
        if len(self.written) >= MAX_PRESENT:
            self.written.clear()
        self.written[member] = written + self.refresh

    async def end(self, me: Identity, hook: HookInput) -> None:
        """SessionEnd: release the agent's leases, end its presence."""
        held = await self.coord.leases.listed(me.namespace, agent_id=me.agent_id, limit=MAX_LISTED)
        for lease in held["leases"]:
            with contextlib.suppress(NotFound):  # ended meanwhile
                await self.coord.leases.release(me, lease["leaseId"])
        member = presence_of(me, hook)
        self.written.pop(member, None)
        await self.coord.store.command("ZREM", keys.hook_agents(me.namespace), member[1])
        await self.coord.presence.unvisit(me.namespace, hook.session_id, me.agent_id)

    async def news(self, me: Identity) -> str | None:
        """What is new for the agent since it last surfaced, or None."""
        found = await self.coord.mailbox.surface(me, self.settings.hook_notices_max)
        if not found:
            return None
        return fit(f"memento: new for you ({me.agent_id}) since your last step:",
                   [("Messages and conflicts (answer with send_message; ack_messages when handled):",
                     [message_line(message) for message in found])])

    async def start_context(self, me: Identity, hook: HookInput) -> str:
        """SessionStart: the others at work now, unread messages, and this session's past when others had it."""
        others = await self.others(me)
        unread = (await self.coord.mailbox.read(me, unread_only=True, limit=self.settings.hook_notices_max))["messages"]
        seen = {message["messageId"] for message in unread}
        unread += [m for m in await self.coord.mailbox.surface(me, self.settings.hook_notices_max)
                   if m["messageId"] not in seen]
        sections = [("Other agents at work in this namespace now (reach one with send_message to its id):", others),
                    ("Unread messages:", [message_line(message) for message in unread]),
                    ("This session was worked on before by other agents; its last events:",
                     await self.handoff(me, hook))]
        return fit(f"memento: you are agent {me.agent_id} in namespace {me.namespace}.", sections)

    async def others(self, me: Identity) -> list[str]:
        """A line per other agent seen in a hook lately: its leases and its session's last events."""
        since = int((time.time() - self.settings.presence_visit) * 1000)
        members = await self.coord.store.command("ZRANGEBYSCORE", keys.hook_agents(me.namespace), since, "+inf")
        others = [str(m) for m in members if not str(m).startswith(f"{me.agent_id}|")]
        lines = []
        for member in others[-MAX_OTHERS:][::-1]:  # the most recent first
            agent, _, session_id = member.partition("|")
            leases = (await self.coord.leases.listed(me.namespace, agent_id=agent, limit=5))["leases"]
            held = "; ".join(lease_line(lease) for lease in leases) or "nothing"
            lines.append(f"- {agent} (session {session_id}) leases {held}; last: {await self.last(me, session_id)}")
        if len(others) > MAX_OTHERS:
            lines.append(f"- and {len(others) - MAX_OTHERS} more agent(s): list_leases shows what they hold")
        return lines

    async def last(self, me: Identity, session_id: str) -> str:
        try:
            _, raws = await self.manager.tail(me.namespace, session_id, 3)
        except NotFound:
            return "no events"
        return ", ".join(event_line(raw) for raw in raws) or "no events"

    async def handoff(self, me: Identity, hook: HookInput) -> list[str]:
        """The session's last events when agents other than this one (and its token's own) worked in it."""
        try:
            session, raws = await self.manager.tail(me.namespace, hook.session_id, 8)
        except NotFound:
            return []
        parent = me.agent_id.rpartition(":")[0]
        if not set(session["agentIds"]) - {me.agent_id, parent}:
            return []
        return [f"- state {session['state']}, agents {', '.join(session['agentIds'])}",
                *(f"- {event_line(raw)}" for raw in raws)]

    async def edit(self, me: Identity, hook: HookInput, entity: str, policy: str, claim_ttl: int) -> Result:
        """PreToolUse of an edit: warn about or deny another agent's lease, else claim (or renew) the file."""
        if policy == "off":
            return {}
        holds = await self.coord.leases.holds(me.namespace, [entity])
        conflicts = [hold for hold in holds if hold["heldBy"] != me.agent_id]
        if conflicts:
            reason = await self.held_reason(me, entity, conflicts)
            if policy == "enforce":
                return output("PreToolUse", permissionDecision="deny", permissionDecisionReason=reason)
            return output("PreToolUse", "memento warning: " + reason)
        if claim_ttl > 0:
            await self.claim(me, hook, entity, claim_ttl, held=bool(holds))
        return {}

    async def held_reason(self, me: Identity, entity: str, conflicts: list[Result]) -> str:
        """Who holds the entity, why, until when, and how to reach them."""
        named = list(dict.fromkeys(conflict["leaseId"] for conflict in conflicts[:3]))
        leases = {lease["leaseId"]: lease for lease in await self.coord.leases.views(me.namespace, named)}
        parts = []
        for conflict in conflicts[:3]:
            lease = leases.get(conflict["leaseId"], {})
            why = f" for {lease['reason']!r}" if lease.get("reason") else ""
            parts.append(f"{conflict['heldBy']} holds {entity}{why} until {lease.get('expiresAt', '?')} "
                         f"(lease {conflict['leaseId']}, {conflict['mode']})")
        holders = ", ".join(dict.fromkeys(conflict["heldBy"] for conflict in conflicts))
        return (f"{'; '.join(parts)}. Ask before editing it: send_message to {holders} (the memento MCP tool), "
                "or wait for the lease to end.")

    async def claim(self, me: Identity, hook: HookInput, entity: str, ttl: int, held: bool = True) -> None:
        """The edit's exclusive lease on the file: renewed when the agent holds one (`held`: the file has holds,
        all the agent's own), else taken."""
        if held:
            listed = (await self.coord.leases.listed(me.namespace, entity_id=entity, limit=MAX_LISTED))["leases"]
            mine = [lease for lease in listed if lease["agentId"] == me.agent_id and lease["entityIds"] == [entity]]
            if mine:
                await self.coord.leases.renew(me, mine[0]["leaseId"], ttl)
                return
        since = iso(int(time.time() * 1000))
        await self.coord.leases.acquire(me, [entity], ttl, "exclusive", hook.session_id,
                                        f"editing ({hook.record.get('tool_name')}) since {since}")
