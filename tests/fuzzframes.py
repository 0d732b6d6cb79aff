"""Seeded hostile JSON-RPC frames for the fuzz test, each with what the daemon must answer.

A `Frame` carries the raw text (or bytes) sent as it is, its category, and its expectation:
`error` (refused at the door: an error reply, never a result), `result`, or `any` (either, but an
answer). Frames are built with `json.dumps`, which writes NaN and Infinity as bare words and escapes
control characters, so the daemon decodes them into real NaNs and real NULs.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

CONTROL = ["\x00", "\x01", "\x07", "\x1b", "\x1f", "\x7f", "\n", "\t", "\x85", "\x9b"]
NON_FINITE = [float("nan"), float("inf"), float("-inf"), 1e13, -1e13, 1e300, -1e308]
WRITE_METHODS = ["event.emit", "event.emitBatch", "session.create", "session.join", "session.leave"]
READ_METHODS = ["session.get", "session.list", "session.subscribe", "session.unsubscribe", "bridge.transitions",
                "bridge.isolate", "bridge.handoff", "bridge.outcomes", "session.checkpoint"]
# Codes a hostile frame may get back; -32603 (internal error) and -32050 (a backend refused) are bugs here.
ALLOWED_CODES = {-32700, -32600, -32601, -32602, -32001, -32004, -32009, -32029}


@dataclass
class Target:
    """The sessions the frames aim at: the fuzzing namespace's own, and another namespace's."""

    own: list[str]
    foreign: list[str]
    agent: str
    ids: list[str] = field(default_factory=lambda: [f"dup-{i}" for i in range(20)])


@dataclass(frozen=True)
class Frame:
    """One frame to send, and what must come back."""

    category: str
    payload: str | bytes
    expect: str  # "error" | "result" | "any"
    codes: frozenset[int] = frozenset(ALLOWED_CODES)


def request(rng: random.Random, method: str, params: Any, *, with_params: bool = True) -> dict[str, Any]:
    """A request envelope with an id (a number or a string, never one the probes use)."""
    rid: int | str = rng.randrange(1, 2**31) if rng.random() < 0.7 else f"f{rng.randrange(10**6)}"
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
    if with_params:
        message["params"] = params
    return message


def dumps(message: Any) -> str:
    """JSON text as a careless client writes it: NaN/Infinity as bare words (allow_nan), UTF-8 as is."""
    return json.dumps(message, ensure_ascii=False)


def good_event(rng: random.Random, t: Target) -> dict[str, Any]:
    """An event the daemon must accept: the base the mutating generators spoil."""
    event: dict[str, Any] = {"type": rng.choice(["modified", "broke", "test_pass", "custom.kind"])}
    if rng.random() < 0.5:
        event["id"] = rng.choice(t.ids)
    if rng.random() < 0.5:
        event["changeInfo"] = {"elementType": "function", "entityIds": [f"fn:{rng.randrange(50)}"],
                               "operation": "modified", "affectedLines": rng.randrange(100)}
    if rng.random() < 0.3:
        event["impact"] = {"severity": rng.choice(["low", "high"]), "perfDelta": rng.uniform(-50, 50)}
    if rng.random() < 0.3:
        event["stateTransition"] = {"to": rng.choice(["working", "broken"]), "confidence": rng.random()}
    if rng.random() < 0.2:
        event["data"] = {"note": "ok", "n": rng.randrange(1000), "nested": {"a": [1, 2, {"b": None}]}}
    return event


def emit(rng: random.Random, t: Target, event: Any) -> dict[str, Any]:
    return request(rng, "event.emit", {"sessionId": rng.choice(t.own), "event": event})


# -- the categories -------------------------------------------------------------------------------------


def valid(rng: random.Random, t: Target) -> Frame:
    """Good emits (ids from a small pool, so retries dedup) and reads: they keep the sessions busy."""
    if rng.random() < 0.8:
        return Frame("valid", dumps(emit(rng, t, good_event(rng, t))), "result")
    sid = rng.choice(t.own)
    method, params = rng.choice([("session.get", {"sessionId": sid, "limit": 5}), ("session.list", {}),
                                 ("session.join", {"sessionId": sid}), ("bridge.handoff", {"sessionId": sid})])
    return Frame("valid", dumps(request(rng, method, params)), "result")


_WRONG: list[tuple[str, Any]] = [
    ("type", 5), ("type", ["modified"]), ("type", {}), ("type", None), ("id", 7), ("id", []),
    ("changeInfo", "fn:1"), ("changeInfo", [1]), ("impact", 3), ("stateTransition", "broken"),
    ("data", "text"), ("data", [1, 2]), ("timestamp", "yesterday"), ("timestamp", [2026]),
    ("changeInfo", {"entityIds": "fn:1"}), ("changeInfo", {"entityIds": [1, 2]}),
    ("changeInfo", {"affectedLines": "many"}), ("changeInfo", {"affectedLines": -1}),
    ("changeInfo", {"operation": "exploded"}), ("stateTransition", {"to": "on fire"}),
    ("stateTransition", {"to": "broken", "confidence": "high"}), ("stateTransition", {"to": "broken", "confidence": 2}),
    ("impact", {"severity": "apocalyptic"}), ("impact", {"perfDelta": "fast"}), ("impact", {"testsFailed": "t1"}),
    ("seq", 1), ("sessionId", "other"), ("epoch", "x"),
]


def wrong_types(rng: random.Random, t: Target) -> Frame:
    """A field of the wrong type or out of its range, in an event or in the params."""
    if rng.random() < 0.7:
        event = good_event(rng, t)
        name, value = rng.choice(_WRONG)
        event[name] = value
        return Frame("wrong_types", dumps(emit(rng, t, event)), "error", frozenset({-32602}))
    sid = rng.choice(t.own)
    method, params = rng.choice([
        ("session.get", {"sessionId": sid, "since": "a"}), ("session.get", {"sessionId": sid, "limit": -1}),
        ("session.get", {"sessionId": sid, "condensed": {}}), ("session.list", {"limit": []}),
        ("session.list", {"state": 3}), ("session.create", {"ttl": "long"}), ("session.create", {"labels": []}),
        ("event.emitBatch", {"sessionId": sid, "events": {}}), ("event.emit", {"sessionId": 12, "event": {}}),
        ("session.subscribe", {"sessionId": sid, "since": []}), ("session.checkpoint", {"sessionId": sid, "final": []}),
        ("event.emit", {"sessionId": sid}), ("session.get", {}), ("event.emit", {"sessionId": sid, "event": "x"}),
    ])
    return Frame("wrong_types", dumps(request(rng, method, params)), "error", frozenset({-32602}))


NEST = "__NEST__"


def nested_text(depth: int, as_list: bool) -> str:
    """JSON nested `depth` deep, as text (json.dumps itself would hit Python's recursion limit)."""
    if as_list:
        return "[" * depth + "1" + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


def deep_nesting(rng: random.Random, t: Target) -> Frame:
    """Deep arrays or objects: too deep to parse (refused), or shallow enough to sit inside `data`."""
    as_list = rng.random() < 0.5
    if rng.random() < 0.6:
        where = rng.choice(["params", "data", "id"])
        if where == "params":
            message = request(rng, "session.get", NEST)
        elif where == "id":
            message = request(rng, "session.list", {})
            message["id"] = NEST
        else:
            message = emit(rng, t, {"type": "modified", "data": {"d": NEST}})
        text = dumps(message).replace(f'"{NEST}"', nested_text(rng.choice([1_000, 5_000, 20_000, 100_000]), as_list))
        return Frame("deep_nesting", text, "error")
    depth = rng.randrange(2, 60)
    text = dumps(emit(rng, t, {"type": "modified", "data": {"d": NEST}})).replace(f'"{NEST}"',
                                                                                    nested_text(depth, as_list))
    return Frame("deep_nesting", text, "any")


def huge_batch(rng: random.Random, t: Target) -> Frame:
    """emitBatch past the 500-event cap, or within it with one bad event: refused as a whole."""
    events: list[dict[str, Any]]
    if rng.random() < 0.5:
        events = [{"type": "modified"}] * rng.randrange(501, 3_000)
    else:
        events = [{"type": "modified", "id": f"b{rng.randrange(10**9)}-{i}"} for i in range(rng.randrange(2, 500))]
        events[rng.randrange(len(events))] = {"type": "modified", "impact": {"perfDelta": float("nan")}}
    message = request(rng, "event.emitBatch", {"sessionId": rng.choice(t.own), "events": events})
    return Frame("huge_batch", dumps(message), "error", frozenset({-32602}))


_NUMERIC_SPOTS: list[Callable[[dict[str, Any], float], None]] = [
    lambda e, x: e.update(impact={"perfDelta": x}),
    lambda e, x: e.update(stateTransition={"to": "broken", "confidence": x}),
    lambda e, x: e.update(changeInfo={"affectedLines": x}),
    lambda e, x: e.update(data={"n": x}),
    lambda e, x: e.update(data={"deep": [{"n": [x]}]}),
]


def non_finite(rng: random.Random, t: Target) -> Frame:
    """NaN, Infinity and numbers over 1e12 in magnitude: -32602 wherever they are."""
    x = rng.choice(NON_FINITE)
    if rng.random() < 0.8:
        event = good_event(rng, t)
        rng.choice(_NUMERIC_SPOTS)(event, x)
        return Frame("non_finite", dumps(emit(rng, t, event)), "error", frozenset({-32602, -32700}))
    sid = rng.choice(t.own)
    method, params = rng.choice([("session.get", {"sessionId": sid, "since": x}),
                                 ("session.subscribe", {"sessionId": sid, "since": x}),
                                 ("session.get", {"sessionId": sid, "limit": x}),
                                 ("session.create", {"ttl": x}),
                                 ("bridge.isolate", {"sessionId": sid, "agentId": t.agent, "since": x})])
    return Frame("non_finite", dumps(request(rng, method, params)), "error", frozenset({-32602, -32700}))


def _with_control(rng: random.Random, base: str) -> str:
    cut = rng.randrange(len(base) + 1)
    return base[:cut] + rng.choice(CONTROL) + base[cut:]


def control_chars(rng: random.Random, t: Target) -> Frame:
    """Control characters (NUL, ESC, DEL, C1, newline) in ids: session, event, entity, test, agent, actor."""
    bad = _with_control(rng, rng.choice(["fn:a", "x", "sess-1", ""]))
    sid = rng.choice(t.own)
    event = good_event(rng, t)
    spot = rng.randrange(8)
    if spot == 0:
        event["id"] = bad
    elif spot == 1:
        event["changeInfo"] = {"entityIds": ["fn:ok", bad]}
    elif spot == 2:
        event["impact"] = {"testsFailed": [bad]}
    elif spot == 3:
        event["actor"] = bad
    else:
        method, params = [("event.emit", {"sessionId": bad, "event": event}),
                          ("session.create", {"sessionId": bad}), ("session.create", {"entityIds": [bad]}),
                          ("bridge.transitions", {"sessionId": sid, "entityId": bad})][spot - 4]
        return Frame("control_chars", dumps(request(rng, method, params)), "error", frozenset({-32602}))
    return Frame("control_chars", dumps(request(rng, "event.emit", {"sessionId": sid, "event": event})), "error",
                 frozenset({-32602}))


def foreign_ids(rng: random.Random, t: Target) -> Frame:
    """Another namespace's session, by every method that takes a session id: it does not exist here."""
    sid = rng.choice(t.foreign)
    method = rng.choice(WRITE_METHODS[:2] + WRITE_METHODS[3:] + READ_METHODS[:1] + READ_METHODS[2:5]
                        + READ_METHODS[6:7] + ["session.checkpoint"])
    params: dict[str, Any] = {"sessionId": sid}
    if method == "event.emit":
        params["event"] = good_event(rng, t)
    elif method == "event.emitBatch":
        params["events"] = [good_event(rng, t)]
    elif method == "bridge.isolate":
        params["agentId"] = t.agent
    elif method == "session.checkpoint":
        params["final"] = rng.random() < 0.5
    codes = frozenset({-32004, -32001})
    if method == "session.unsubscribe":
        return Frame("foreign_ids", dumps(request(rng, method, params)), "any", codes)
    return Frame("foreign_ids", dumps(request(rng, method, params)), "error", codes)


def unknown_method(rng: random.Random, t: Target) -> Frame:
    """Names no method has: near misses, internals, empty, long, odd characters."""
    name = rng.choice(["", " ", "event.emit ", "EVENT.EMIT", "event", "session.", "__init__", "registry.call",
                       "rpc.describe", "rpc.discover.x", "session.create\x00", "ßession.get",
                       "a" * rng.randrange(200, 5_000), "event.emit.emit", "../session.get", "session.get\n",
                       "handle_frame"])
    return Frame("unknown_method", dumps(request(rng, name, {})), "error", frozenset({-32601}))


def non_object_params(rng: random.Random, t: Target) -> Frame:
    """Params that are not an object (a list, a string, a number, a boolean) for real methods."""
    method = rng.choice(WRITE_METHODS + READ_METHODS + ["sessions.watch"])
    params = rng.choice([[t.own[0]], [], "x", 0, 1.5, True, False, [{"sessionId": t.own[0]}]])
    return Frame("non_object_params", dumps(request(rng, method, params)), "error", frozenset({-32602, -32600}))


def batch_array(rng: random.Random, t: Target) -> Frame:
    """A JSON-RPC batch (an array of requests, or an empty one): not supported, one -32600 reply."""
    items = [request(rng, "session.list", {}) for _ in range(rng.randrange(0, 50))]
    if items and rng.random() < 0.5:
        items.append(emit(rng, t, good_event(rng, t)))
    return Frame("batch_array", dumps(items), "error", frozenset({-32600}))


def oversized_strings(rng: random.Random, t: Target) -> Frame:
    """Strings far past their field's limit (ids, type, data, labels), frames kept under the 1 MiB close."""
    size = rng.choice([300, 20_000, 70_000, 300_000, 900_000])
    big = "x" * size if rng.random() < 0.7 else "é" * max(300, size // 2)  # é: 2 bytes, every frame < 1 MiB
    spot = rng.randrange(6)
    if spot == 0:
        message = emit(rng, t, {"type": "modified", "id": big})
    elif spot == 1:
        message = emit(rng, t, {"type": big})
    elif spot == 2:
        message = emit(rng, t, {"type": "modified", "data": {"blob": big * 60 if len(big) < 1000 else big}})
    elif spot == 3:
        message = request(rng, "event.emit", {"sessionId": big, "event": {"type": "modified"}})
    elif spot == 4:
        message = emit(rng, t, {"type": "modified", "changeInfo": {"entityIds": [big + "_"]}})
    else:
        message = request(rng, "session.create", {"labels": {"k": big}, "sessionId": f"big-{rng.randrange(10**9)}"})
    return Frame("oversized_strings", dumps(message), "error", frozenset({-32602}))


_MALFORMED: list[tuple[str | bytes, str]] = [
    ("", "error"), ("{", "error"), ("}", "error"), ("null", "error"), ("[]x", "error"), ("42", "error"),
    ('"str"', "error"), ("true", "error"), ("{'a': 1}", "error"), ('{"jsonrpc":"2.0",,}', "error"),
    ('{"jsonrpc":"1.0","id":1,"method":"session.list"}', "error"), ('{"jsonrpc":"2.0","id":1}', "error"),
    ('{"jsonrpc":"2.0","id":1,"method":7}', "error"), ('{"jsonrpc":"2.0","id":{},"method":"session.list"}', "error"),
    ('{"jsonrpc":"2.0","id":true,"method":"session.list"}', "error"),
    ('{"jsonrpc":"2.0","id":[1],"method":"session.list"}', "error"),
    ('{"jsonrpc":"2.0","id":NaN,"method":"session.list"}', "error"),
    ('{"jsonrpc":"2.0","id":1e400,"method":"session.list"}', "error"),
    ('{"jsonrpc":"2.0","id":Infinity,"method":"session.list"}', "error"),
    (b'{"jsonrpc":"2.0","id":1,"method":"\xff\xfe"}', "error"), (b"\x00\x01\x02", "error"), ("\x00", "error"),
    ('{"jsonrpc":"2.0","id":1,"method":"session.list"}\x00', "error"),
    ('{"jsonrpc":"2.0","id":1,"method":"session.list","params":{}} trailing', "error"),
    ('{"jsonrpc":"2.0","id":1,"method":"session.list","method":"event.emit"}', "any"),
    ('{"jsonrpc":"2.0","id":1,"method":"session.list","params":{"limit":1,"limit":"x"}}', "any"),
    ('{"jsonrpc":"2.0","id":1,"method":"session.list","params":{"agentId":"\\ud800"}}', "error"),
    ('{"jsonrpc":"2.0","id":"\\udfff","method":"session.list"}', "any"),
    ('{"jsonrpc":"2.0","id":-1e300,"method":"session.list"}', "error"),
    ('{"jsonrpc":"2.0","id":123456789012345678901234567890,"method":"session.list"}', "any"),
]


def malformed_envelope(rng: random.Random, t: Target) -> Frame:
    """Frames that are not a request: broken JSON, wrong jsonrpc, odd ids, bad UTF-8, lone surrogates."""
    payload, expect = rng.choice(_MALFORMED)
    return Frame("malformed_envelope", payload, expect, frozenset({-32700, -32600, -32601, -32602}))


def lone_surrogates(rng: random.Random, t: Target) -> Frame:
    """Unpaired UTF-16 surrogates (valid JSON escapes, invalid text) in every string an event carries."""
    bad = rng.choice(["\\ud800", "\\udfff", "a\\ud83d"])
    spot = rng.choice(['"id":"x%s"', '"type":"modified","data":{"k":"%s"}', '"changeInfo":{"entityIds":["%s"]}',
                       '"impact":{"externalRef":"%s"}', '"changeInfo":{"elementType":"%s"}'])
    body = spot % bad
    if '"type"' not in body:
        body = '"type":"modified",' + body
    frame = (f'{{"jsonrpc":"2.0","id":{rng.randrange(1, 10**6)},"method":"event.emit",'
             f'"params":{{"sessionId":"{rng.choice(t.own)}","event":{{{body}}}}}}}')
    return Frame("lone_surrogates", frame, "error", frozenset({-32602, -32700}))


GENERATORS: list[tuple[Callable[[random.Random, Target], Frame], int]] = [
    (valid, 12), (wrong_types, 12), (deep_nesting, 5), (huge_batch, 3), (non_finite, 12), (control_chars, 12),
    (foreign_ids, 8), (unknown_method, 6), (non_object_params, 6), (batch_array, 4), (oversized_strings, 3),
    (malformed_envelope, 8), (lone_surrogates, 5),
]


def frames(seed: int, count: int, target: Target) -> list[Frame]:
    """`count` frames drawn by weight from every category; the same seed gives the same frames."""
    rng = random.Random(seed)
    makers = [maker for maker, _ in GENERATORS]
    weights = [weight for _, weight in GENERATORS]
    return [rng.choices(makers, weights)[0](rng, target) for _ in range(count)]
