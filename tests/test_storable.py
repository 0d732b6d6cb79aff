"""sessions/checks.py: the fast check an event's data passes first agrees with the walk that names problems."""

from __future__ import annotations

import random
from typing import Any

import pydantic_core

from memento_sessions.sessions.checks import surely_storable, value_problem
from memento_sessions.sessions.models import EncodedData, EventIn

SCALARS: list[Any] = [0, 1, -1, 10**12, -(10**12), 10**12 + 1, -(10**13), 10**30, 0.5, 1e12, -1e12, 1.0000001e12,
                      1e16, -1.5e300, 1e-300, float("nan"), float("inf"), float("-inf"), True, False, None, "",
                      "text", "a\u0000b", "é\n\"", "1e+16", "NaN", "1234567890123456"]


def nested(rng: random.Random, depth: int = 0) -> Any:
    """A random JSON-like value built from SCALARS, keys sometimes holding a NUL."""
    roll = rng.random()
    if depth > 3 or roll < 0.5:
        return rng.choice(SCALARS)
    if roll < 0.75:
        return [nested(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(["k", "key", "k\u0000"]) + str(i): nested(rng, depth + 1) for i in range(rng.randint(0, 3))}


def test_the_fast_check_passes_only_values_the_walk_passes_and_most_of_those() -> None:
    rng, passed, clean = random.Random(7), 0, 0
    for _ in range(5000):
        value = {"v": nested(rng)}
        sure = surely_storable(value, pydantic_core.to_json(value, inf_nan_mode="constants"))
        problem = value_problem(value, "data")
        assert not (sure and problem), (value, problem)  # never waves a problem through
        passed += sure
        clean += problem is None
    assert passed == clean, "every clean value made only of JSON types passes without the walk"


def test_validated_data_carries_the_encoding_its_event_stores() -> None:
    event = EventIn.model_validate({"type": "x", "data": {"text": "é \" \n", "n": [1, 2.5, None, True]}})
    assert isinstance(event.data, EncodedData)
    assert event.data.encoded == pydantic_core.to_json({"text": "é \" \n", "n": [1, 2.5, None, True]})
    assert event.model_dump()["data"] == {"text": "é \" \n", "n": [1, 2.5, None, True]}
