"""Task claims: a `task:<id>` entity claimed with an exclusive lease, and its completion fenced by the claim.

Claiming is `lease.acquire {entityIds: ["task:<id>"], mode: "exclusive"}` (the `claim_task` tool): the grant is
one Function call, so among any number of racing agents exactly one wins. The winner's fencing token is then
required on the task's completion: an event of a completion type (`task_done`) whose `changeInfo.entityIds`
name a task is refused with -32009 `stale_lease`, writing nothing, unless its `fencingToken` is the newest
exclusive grant's on each task it names: without a token, with an older claim's, or on a task never claimed.
"""

from __future__ import annotations

from collections.abc import Sequence

from memento_sessions.coordination.leases import Leases
from memento_sessions.errors import Conflict
from memento_sessions.sessions.models import EventIn

TASK_PREFIX = "task:"
COMPLETIONS = frozenset({"task_done"})  # event types that complete the tasks they name


def completing(events: Sequence[EventIn]) -> list[tuple[EventIn, list[str]]]:
    """The events that complete tasks, each with the tasks it names."""
    found = []
    for event in events:
        if event.type in COMPLETIONS and event.changeInfo is not None:
            tasks = [entity for entity in event.changeInfo.entityIds if entity.startswith(TASK_PREFIX)]
            if tasks:
                found.append((event, tasks))
    return found


async def check_completions(leases: Leases, namespace: str, events: Sequence[EventIn]) -> None:
    """Refuse (stale_lease) a completion whose fencing token is not its tasks' current claim's."""
    done = completing(events)
    if not done:
        return
    claims = dict(await leases.fences(namespace, sorted({task for _, tasks in done for task in tasks})))
    for event, tasks in done:
        for task in tasks:
            if event.fencingToken is None or claims.get(task) != event.fencingToken:
                raise Conflict(f"{event.type} for {task} needs the fencing token of the task's current claim "
                               f"({'none given' if event.fencingToken is None else 'not the current one'}); "
                               "claim the task with an exclusive lease first",
                               {"reason": "stale_lease", "entityId": task})
