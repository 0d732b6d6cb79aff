"""Live sessions: the wire models, the Redis Function library and the SessionManager.

models.py (events and sessions on the wire), functions.lua (the Redis Functions behind every write),
store.py (loads the library), manager.py (the SessionManager), methods.py (`session.*`, `event.*`),
frames.py (the `session.event` frame: built, and read by seq and epoch), paging.py, condense.py,
storable.py, janitor.py (keeps the session indexes free of expired sessions).

May import the shared ground (the package root) and redisio/; nothing above.
"""
