"""The KG context of breakage windows, asked for while the session's later events are still being folded.

A first `bridge.transitions` on a 1,000-event session spends about as long reading, decoding and folding
the events (bridge/cache.py) as FalkorDB spends on the graph query for the windows they yield. The cache
therefore folds in chunks and hands each chunk's new windows here, which sends their query at once:
FalkorDB answers on its own threads while Python folds the next chunk. A large batch is split in two
queries, which FalkorDB runs side by side. Hints are only a head start: `result` asks for every id its
caller names that no earlier query covered, so a missed or partial hint never changes the answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Any

from memento_sessions.bridge.queries import TRANSITION_CONTEXT
from memento_sessions.kg.graph import Graphs

Context = dict[str, dict[str, Any]]  # entityId -> {"specs": set, "clusters": set, "benchmarks": {id: delta}}
SPLIT_ABOVE = 64  # ids; a larger batch goes out as two queries


class TransitionContext:
    """Graph queries for entity ids, started as soon as the ids are known, merged by entity."""

    def __init__(self, graphs: Graphs, namespace: str) -> None:
        self.graphs = graphs
        self.namespace = namespace
        self._asked: set[str] = set()
        self._queries: list[asyncio.Task[list[list[Any]]]] = []

    def ask(self, windows: Iterable[Sequence[str]]) -> bool:
        """Start the queries for the windows' entities not asked for yet; whether any was started."""
        fresh = list({entity: None for window in windows for entity in window if entity not in self._asked})
        if not fresh:
            return False
        self._asked.update(fresh)
        half = (len(fresh) + 1) // 2 if len(fresh) > SPLIT_ABOVE else len(fresh)
        for start in range(0, len(fresh), half):
            rows = self.graphs.rows(self.namespace, TRANSITION_CONTEXT, {"ids": fresh[start:start + half]})
            self._queries.append(asyncio.ensure_future(rows))
        return True

    async def result(self, windows: Iterable[Sequence[str]]) -> Context:
        """The context of every entity of `windows` (and of any hinted before), once all queries answered."""
        self.ask(windows)
        context: Context = {}
        for rows in await asyncio.gather(*self._queries):
            for entities, specs, clusters, benches in rows:
                for entity in entities:
                    found = context.setdefault(entity, {"specs": set(), "clusters": set(), "benchmarks": {}})
                    found["specs"].update(specs)
                    found["clusters"].update(clusters)
                    found["benchmarks"].update(map(tuple, benches))
        return context

    def cancel(self) -> None:
        """Cancel the queries still running (the call failed or was cancelled before it awaited them)."""
        for query in self._queries:
            if not query.done():
                query.cancel()
            elif not query.cancelled():
                query.exception()  # retrieved: the call's own error is what gets reported
        self._queries = []
