"""Live sessions: the wire models, the Redis Function library and the SessionManager."""
