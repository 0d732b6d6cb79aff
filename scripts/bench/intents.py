"""lease.acquire {mode: "intent"} on a 10,000-entity graph: each intent reads the entities two relationships
around its own and the other agents' leases and intents on them; beside the bare GRAPH.RO_QUERY of the same
traversal (the floor: the intent's own graph read, with nothing around it)."""

from __future__ import annotations

import random

from bench import cypher
from bench.bridge import load_fixture
from bench.harness import Env, Figure, Target, latency_extra, pct, timed, ws
from memento_sessions.kg.graph import NEIGHBOURS, ROWS_PER_ENTITY

EXPANDED = 512  # MEMENTO_INTENT_MAX_EXPANDED's default, as the daemon runs it
SHAPE = "(10k-entity graph, 200 leases of another agent)"


async def measure(env: Env) -> list[Figure]:
    """The intent's p99, and its ratio to the bare traversal's."""
    entity_ids, graph_name = await load_fixture(env, 10_000)
    rng = random.Random(5)
    picks = [rng.choice(entity_ids) for _ in range(100 if env.quick else 500)]
    query = NEIGHBOURS.format(limit=EXPANDED * ROWS_PER_ENTITY)
    async with ws(env, "intent-holder") as holder, ws(env, "intent-planner") as planner:
        for entity in rng.sample(entity_ids, 200):
            await holder.call("lease.acquire", {"entityIds": [entity], "ttl": 600, "mode": "shared"})
        intents = await timed(len(picks), lambda i: planner.call("lease.acquire", {
            "entityIds": [picks[i]], "ttl": 60, "mode": "intent"}), remote=True)
    bare = await timed(len(picks), lambda i: env.falkordb.execute_command(  # type: ignore[no-untyped-call]
        "GRAPH.RO_QUERY", graph_name, cypher.query(query, {"ids": [picks[i]]}), "--compact"), remote=True)
    extra = latency_extra(intents, bare)
    return [Figure(f"lease.acquire intent, depth-2 overlaps, p99 {SHAPE}", "ms", pct(intents, 0.99), pct(bare, 0.99),
                   Target.below_ms(10), higher_is_better=False, extra=extra),
            Figure(f"lease.acquire intent p99 over the bare traversal's {SHAPE}", "x",
                   pct(intents, 0.99) / max(pct(bare, 0.99), 1e-9), None, Target.under(5, "x"),
                   higher_is_better=False, extra=extra)]
