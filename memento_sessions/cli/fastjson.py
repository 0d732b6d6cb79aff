"""JSON for the hook's lean path, from the C accelerator `_json` the json package itself uses.

The json package's decoder compiles regular expressions at import, which imports `re` and `enum`: about
5 ms of CPU, half of what the hook's one-round-trip path (cli/hook.py\'s `post_input`) costs beyond the interpreter's
start. The C scanner and encoder need none of it: they are what `json.loads` and `json.dumps` run for
these inputs anyway. Same results (floats as repr, NaN and Infinity as json writes and reads them), compact
separators; bad JSON raises ValueError (json.JSONDecodeError when the json package is loaded already; else the
accelerator, finding no JSONDecodeError, fails with a SystemError, said here as a ValueError).
"""

from __future__ import annotations

import _json

TYPE_CHECKING = False  # not `typing` (mypy takes any name TYPE_CHECKING as true)
if TYPE_CHECKING:
    from typing import Any

SPACE = " \t\n\r"
CONSTANTS = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}


class _Decoding:
    """What the C scanner reads off its context: json.JSONDecoder()'s defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = CONSTANTS.__getitem__
    memo: dict[str, str] = {}


def _unencodable(value: object) -> object:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


_scan = _json.make_scanner(_Decoding())  # type: ignore[arg-type]  # (the stub says a JSONDecoder: it reads only these)
# (markers, default, encoder, indent, key_separator, item_separator, sort_keys, skipkeys, allow_nan)
_encode = _json.make_encoder(None, _unencodable, _json.encode_basestring, None, ":", ",", False, False, True)


def loads(text: str | bytes) -> Any:
    """The value of one JSON document (UTF-8 when bytes); ValueError when it is not one."""
    if not isinstance(text, str):
        text = bytes(text).decode("utf-8").removeprefix("\ufeff")  # (json reads a BOM in bytes too)
    start = len(text) - len(text.lstrip(SPACE))
    try:
        value, end = _scan(text, start)
    except StopIteration as exc:
        raise ValueError(f"expecting a JSON value at {exc.value}") from None
    except SystemError:  # the accelerator's own error, when json.decoder (its JSONDecodeError) is not loaded
        raise ValueError("not JSON") from None
    if text[end:].strip(SPACE):
        raise ValueError(f"extra data at {end}")
    return value


def dumps(value: Any) -> str:
    """`value` as compact JSON, non-ASCII kept as it is (json.dumps(value, separators=(",", ":"),
    ensure_ascii=False)); TypeError for what JSON cannot hold (a hook's values come from JSON: never circular)."""
    if isinstance(value, str):
        return str(_json.encode_basestring(value))
    return "".join(_encode(value, 0))
