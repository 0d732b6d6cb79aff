"""Fair shares of Redis's one thread for lease writes: each namespace's are paced, the others' are not.

An acquire, release or renew works on every entity its lease covers inside one Function call (about 5 us
each on a 2-vCPU host: 20 ms for MEMENTO_LEASE_MAX_COVERED's 4,096), and every other client of the
sessions' Redis waits meanwhile. So each namespace has a budget of MEMENTO_LEASE_PACE covered entities a
second per daemon: a call whose namespace owes more than a tenth of a second of it waits, before it
reaches Redis, until its earlier calls are paid for. A namespace that leases a few entities at a time
never waits; one that sends leases of thousands back to back gets them at the budget's rate, and other
tenants' emits find Redis free between them.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio

from memento_sessions.metrics import LEASE_PACED_SECONDS

KEPT = 10_000  # namespaces whose spending is remembered at once; past it, those fully paid are forgotten
AHEAD = 0.1  # seconds of its budget a namespace may owe without waiting


class Pacer:
    """Per-namespace spending of covered entities, repaid at `rate` a second (0: no pacing)."""

    def __init__(self, rate: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.clock = rate, clock
        self._owed: dict[str, tuple[float, float]] = {}  # namespace -> (entities not yet repaid, as of when)

    def owed(self, namespace: str) -> float:
        """Entities the namespace's earlier calls have not yet repaid."""
        owed, at = self._owed.get(namespace, (0.0, 0.0))
        return max(0.0, owed - (self.clock() - at) * self.rate)

    def charge(self, namespace: str, entities: int) -> float:
        """Add a call's cost; the seconds it must wait first (until what was owed before it, less AHEAD
        seconds' worth, is repaid)."""
        if self.rate <= 0:
            return 0.0
        before = self.owed(namespace)
        if len(self._owed) >= KEPT:
            self._forget_paid()
        self._owed[namespace] = (before + entities, self.clock())
        return max(0.0, before / self.rate - AHEAD)

    async def take(self, namespace: str, entities: int = 0) -> None:
        """Charge a call of `entities` covered entities (0 when it is known only after the call: `charge`
        it then) and wait its turn."""
        wait = self.charge(namespace, entities)
        if wait > 0:
            LEASE_PACED_SECONDS.inc(wait)
            await anyio.sleep(wait)

    def _forget_paid(self) -> None:
        for namespace in [ns for ns in self._owed if self.owed(ns) == 0.0]:
            del self._owed[namespace]
