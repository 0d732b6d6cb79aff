"""Live sessions: the wire models, the Redis Function library and the SessionManager.

models.py (events and sessions on the wire), checks.py (the values every backend can store, checked at
the door), functions.lua (the Redis Functions behind every write), functions.py (loads that library and
translates its errors), manager.py (the SessionManager), methods.py (`session.*`, `event.*`), frames.py
(the `session.event` frame: built, and read by seq and epoch), paging.py (bounded replies), condense.py
(the session's one reducer: the condensed view), conversation.py (`session.conversation`), snapshots.py
(a session's compaction snapshots, kept under its hash tag), janitor.py (keeps the session indexes free
of expired sessions).

May import the shared ground (the package root), redisio/ and usage/; nothing above.
"""
