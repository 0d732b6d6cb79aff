"""How fresh a handoff is: the git state the session's agent last recorded, and how the receiver's compares.

The hook records the agent's HEAD and a digest of its dirty tree as `git:state` events at SessionStart and Stop
(cli/gitstate.py). `bridge.handoff` reads the session's events backwards from the newest, at most
MEMENTO_HANDOFF_FRESHNESS_SCAN of them (pages of SCAN_PAGE, one ZREVRANGEBYSCORE each on the session's one
key), and answers `freshness {head, dirtyDigest, recordedAt, eventsSince}` from the newest record (null when it
finds none). Given the receiver's own `head` (and `dirtyDigest`), it adds `status`:

- `fresh`: the receiver is at the newest record, and no event since changed a file;
- `behind`: the receiver is at the newest record with files changed since, or at an older record of the
  session: `changedFiles` lists the files (`file:` entities of `changeInfo`) changed after it, at most
  FILES_MAX (`changedFilesOmitted` says how many more);
- `diverged`: the receiver is at none of the records read (another commit, or other local changes).

A record matches when its head is the receiver's and, if the receiver gave one, its digest too.
"""

from __future__ import annotations

from typing import Any, cast

from memento_sessions import keys
from memento_sessions.bridge.cache import decode
from memento_sessions.bridge.timeline import Event, entity_ids
from memento_sessions.sessions.manager import SessionManager

Result = dict[str, Any]
EVENT_TYPE = "git:state"  # the hook's record (gitstate.EVENT_TYPE; the daemon does not import the hook's module)
SCAN_PAGE = 500
FILES_MAX = 256
FILE_PREFIX = "file:"


class Scan:
    """What a backward read found: the git records (newest first) and the files changed after each."""

    def __init__(self) -> None:
        self.records: list[tuple[Event, list[str]]] = []  # (record, files changed after it, newest first)
        self.files: dict[str, None] = {}  # changed after the oldest record seen so far (newest first)
        self.scanned = 0

    def add(self, event: Event) -> None:
        """The next older event."""
        self.scanned += 1
        if event.get("type") == EVENT_TYPE and isinstance(event.get("data"), dict):
            self.records.append((event, list(self.files)))
        for entity in entity_ids(event):
            if isinstance(entity, str) and entity.startswith(FILE_PREFIX):
                self.files.setdefault(entity[len(FILE_PREFIX):])

    def match(self, head: str, digest: str | None) -> int | None:
        """The index of the newest record the receiver's state matches."""
        for i, (record, _) in enumerate(self.records):
            data = record["data"]
            if data.get("head") == head and (digest is None or data.get("dirtyDigest") == digest):
                return i
        return None


async def scan(manager: SessionManager, namespace: str, session_id: str, limit: int, head: str | None,
               digest: str | None) -> Scan:
    """The session's events read newest first, at most `limit`, stopping at the first record the receiver's
    `head` and `digest` match or, without a head, at the first record."""
    found, key, below = Scan(), keys.session_keys(namespace, session_id).events, "+inf"
    while found.scanned < limit:
        members = cast(list[tuple[str, float]], await manager.redis.zrevrangebyscore(
            key, below, "-inf", start=0, num=min(SCAN_PAGE, limit - found.scanned), withscores=True))
        if not members:
            break
        for event in decode([str(member) for member, _ in members]):
            found.add(event)
        below = f"({int(members[-1][1])}"
        if found.records and (head is None or found.match(head, digest) is not None):
            break
    return found


async def freshness(manager: SessionManager, namespace: str, session: Result, limit: int, head: str | None,
                    digest: str | None) -> Result | None:
    """The handoff's `freshness` (None when no git record is found in the events read)."""
    found = await scan(manager, namespace, session["sessionId"], limit, head, digest)
    if not found.records:
        return None
    newest, _ = found.records[0]
    data = newest["data"]
    result: Result = {"head": data.get("head"), "dirtyDigest": data.get("dirtyDigest"),
                      "recordedAt": newest.get("timestamp"), "eventsSince": int(session["seq"]) - int(newest["seq"])}
    if head is not None:
        result.update(compare(found, head, digest))
    return result


def compare(found: Scan, head: str, digest: str | None) -> Result:
    """`status`, and the files changed since the receiver's record when it is behind."""
    index = found.match(head, digest)
    if index is None:
        return {"status": "diverged"}
    files = found.records[index][1]
    if not files:
        return {"status": "fresh"}
    result: Result = {"status": "behind", "changedFiles": files[:FILES_MAX]}
    if len(files) > FILES_MAX:
        result["changedFilesOmitted"] = len(files) - FILES_MAX
    return result
