"""A large frame parsed a part at a time gives what one parse of it gives, value or error, whatever its text:
strings and deeper objects holding the text a cut looks for, keys given twice, cuts that do not parse."""

from __future__ import annotations

import json
import random
from typing import Any

import pydantic_core
import pytest

from memento_sessions.errors import RpcError
from memento_sessions.rpc import _HOLE, FRAME_PART, LARGE_FRAME, parse, parse_in_parts

pytestmark = pytest.mark.anyio
TRAPS = ['},{', '},{"type":', '"},{"type":"x"', '\\', '"', '}]},{', ']', '\u00e9\u4e2d', '\U0001f600', '\u0000']


def text(rng: random.Random, traps: float) -> str:
    """A string that may hold what a cut looks for."""
    return "".join(rng.choice(TRAPS) if rng.random() < traps else rng.choice("abc{}[],:")
                   for _ in range(rng.randint(0, 12)))


def value(rng: random.Random, traps: float, depth: int) -> Any:
    kind = rng.randint(0, 5 if depth < 3 else 2)
    if kind == 0:
        return text(rng, traps)
    if kind == 1:
        return rng.choice([rng.randint(-10**20, 10**20), rng.random(), True, None])
    if kind == 2:
        return rng.randint(0, 9)
    if kind == 3:
        return [event(rng, traps, depth + 1) for _ in range(rng.randint(0, 4))]  # objects in a list, as events are
    if kind == 4:
        return [value(rng, traps, depth + 1) for _ in range(rng.randint(0, 3))]
    return {text(rng, traps): value(rng, traps, depth + 1) for _ in range(rng.randint(0, 3))}


def event(rng: random.Random, traps: float, depth: int = 0) -> dict[str, Any]:
    if traps == 0:
        return {"type": "modified", "changeInfo": {"entityIds": [text(rng, 0) for _ in range(rng.randint(0, 9))]}}
    keys = ["type", "data", "changeInfo", text(rng, traps)]
    rng.shuffle(keys)
    return {key: value(rng, traps, depth + 1) for key in keys[:rng.randint(1, 4)]}


def frame(rng: random.Random) -> str:
    """A batch frame: its events full of traps, or plain at both ends (where the first and last cuts are)
    and with traps here and there between (some parts then parse and some do not)."""
    traps = rng.choice([0.3, 0.02, 0.0])
    plain = traps < 0.3
    events = [event(rng, 0 if plain else traps) for _ in range(3)]
    while len(json.dumps(events, separators=(",", ":"))) < 3 * FRAME_PART:
        events += [event(rng, traps) if rng.random() < 0.1 else event(rng, 0) for _ in range(40)]
    events += [event(rng, 0 if plain else traps) for _ in range(3)]
    extra = [] if plain else [event(rng, traps) for _ in range(rng.randint(0, 3))]
    params = {"sessionId": "s", "events": events, "extra": extra}
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": "event.emitBatch", "params": params},
                      separators=(",", ":"), ensure_ascii=rng.random() < 0.5)


def counted_parses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The length of each text pydantic-core parses from now on, in order."""
    parsed: list[int] = []
    from_json = pydantic_core.from_json

    def counted(data: str | bytes, **options: Any) -> Any:
        parsed.append(len(data))
        return from_json(data, **options)

    monkeypatch.setattr(pydantic_core, "from_json", counted)
    return parsed


def outcome(parser: Any, data: str | bytes) -> tuple[Any, ...]:
    try:
        return ("value", parser(data))
    except RpcError as exc:
        return ("error", exc.to_dict())


async def both(data: str | bytes) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    try:
        parts: tuple[Any, ...] = ("value", await parse_in_parts(data))
    except RpcError as exc:
        parts = ("error", exc.to_dict())
    return outcome(parse, data), parts


@pytest.mark.parametrize("seed", range(24))
async def test_a_frame_parsed_in_parts_is_the_frame_parsed_at_once(seed: int,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    data = frame(rng)
    assert len(data) >= LARGE_FRAME
    whole = outcome(parse, data)
    assert whole[0] == "value"
    parsed = counted_parses(monkeypatch)
    assert ("value", await parse_in_parts(data)) == whole
    if '},{"type":' not in json.dumps(whole[1]["params"]["events"][1:-1], separators=(",", ":")):
        assert max(parsed) < len(data)  # no trap inside an element: every cut parsed, the frame never whole


@pytest.mark.parametrize("seed", range(12))
async def test_a_broken_frame_gets_the_same_error_in_parts(seed: int) -> None:
    """Characters cut out or put in near the cuts, where a part's parse meets them."""
    rng = random.Random(seed)
    data = frame(rng)
    at = [i for i in range(len(data)) if data.startswith("},{", i)] or [len(data) // 2]
    for _ in range(8):
        i = rng.choice(at) + rng.randint(-3, 5)
        broken = data[:i] + rng.choice(["", "]", "}", '"', ",", "x"]) + data[i + rng.randint(0, 2):]
        assert await both(broken) == await both(broken)  # the same every time
        whole, parts = await both(broken)
        assert parts == whole, f"at {i}"


async def test_a_key_given_twice_keeps_the_last_list_in_parts_too() -> None:
    events = json.dumps([{"type": "a", "n": n} for n in range(6_000)], separators=(",", ":"))
    later = json.dumps([{"type": "b", "n": n} for n in range(3)], separators=(",", ":"))
    for params in (f'{{"events":{events},"events":{later}}}', f'{{"events":{later},"events":{events}}}',
                   f'{{"events":{events},"other":{events}}}'):
        data = f'{{"jsonrpc":"2.0","id":1,"method":"event.emitBatch","params":{params}}}'
        whole, parts = await both(data)
        assert whole[0] == "value" and parts == whole


async def test_the_placeholder_text_in_a_frame_is_a_string_like_any_other() -> None:
    events = [{"type": _HOLE} if n % 1000 == 0 else _HOLE if n == 3 else {"type": "a", "n": n}
              for n in range(6_000)]
    data = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "event.emitBatch", "params": {"events": events}},
                      separators=(",", ":"))
    whole, parts = await both(data)
    assert whole[0] == "value" and parts == whole


async def test_a_binary_frame_and_a_frame_with_no_list_are_parsed_at_once() -> None:
    data = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "m", "params": {"text": "},{" * 30_000}},
                      separators=(",", ":"))
    for given in (data, data.encode()):
        whole, parts = await both(given)
        assert whole[0] == "value" and parts == whole


async def test_a_lone_surrogate_is_a_parse_error_whole_or_in_parts() -> None:
    """A `str` frame from a transport that did not decode UTF-8 itself: -32700, not an internal error."""
    events = json.dumps([{"type": "a", "n": n} for n in range(6_000)], separators=(",", ":"))
    for where in (0, len(events) // 2):
        broken = events[:where + 1] + '{"type":"\ud800"},' + events[where + 1:]
        data = f'{{"jsonrpc":"2.0","id":1,"method":"event.emitBatch","params":{{"events":{broken}}}}}'
        whole, parts = await both(data)
        assert whole == parts == ("error", {"code": -32700, "message": "parse error: frame is not valid JSON"})
