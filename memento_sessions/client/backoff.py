"""How long the client waits before reconnecting, and how often a retried call is sent again.

The backoff itself is the package's one policy (memento_sessions.retry: `backoff_delay` is `Backoff(first,
cap).delay`, the pauses of the daemon's own reconnect loops too); this module keeps its name here.
"""

from __future__ import annotations

from memento_sessions.retry import backoff_delay as backoff_delay

RETRIES = 5  # times `Client.call(..., retry=True)` is sent again after losing its connection
