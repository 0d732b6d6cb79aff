"""The Redis Function libraries name their arguments at the top of each function.

Each function taking `args` opens with its named-argument block: comment lines (one naming KEYS) and
`local` lines that read `args` into named locals. Below that block no `args[<number>]` is read, so a reader
sees every argument of a call in one place (a variable-length tail is walked from a named start index).
"""

import re
from pathlib import Path

from memento_sessions.usage.library import LIBRARY as USAGE_LIBRARY

PACKAGE = Path(__file__).resolve().parent.parent / "memento_sessions"
SOURCES = {
    "sessions": (PACKAGE / "sessions" / "functions.lua").read_text(),
    "coordination": (PACKAGE / "coordination" / "coordination.lua").read_text(),
    "usage": USAGE_LIBRARY,
}
HEAD = re.compile(r"^local function (\w+)\(([^)]*)\)")
NUMBERED = re.compile(r"\bargs\[\s*\d")


def functions(source: str) -> dict[str, list[str]]:
    """Each top-level `local function`'s name and body lines (up to its `end` in the first column)."""
    found: dict[str, list[str]] = {}
    name = ""
    body: list[str] = []
    for line in source.splitlines():
        head = HEAD.match(line)
        if head and "args" in head.group(2).split(", "):
            name, body = head.group(1), []
        elif name and line == "end":
            found[name] = body
            name = ""
        elif name:
            body.append(line)
    return found


def block(body: list[str]) -> int:
    """How many lines open the body as its named-argument block: comments, and `local` lines that name
    arguments or keys without calling Redis."""
    for index, line in enumerate(body):
        text = line.strip()
        reads_only = text.startswith("local ") and "redis." not in text
        if not (text.startswith("--") or reads_only):
            return index
    return len(body)


def registered(source: str) -> set[str]:
    """The Lua functions a library registers as Redis Functions."""
    direct = re.findall(r"register_function(?:\(|\{)[^,]*,\s*(?:callback\s*=\s*)?(\w+)", source)
    tabled = re.findall(r"\{'\w+', (\w+)\}", source)  # coordination's one table of (name, function)
    return set(direct) | set(tabled)


def test_every_function_reads_its_arguments_only_in_its_named_block() -> None:
    late = [
        f"{library}:{name}: {line.strip()}"
        for library, source in SOURCES.items()
        for name, body in functions(source).items()
        for line in body[block(body) :]
        if NUMBERED.search(line)
    ]
    assert late == []


def test_every_registered_function_names_its_keys_and_arguments_at_the_top() -> None:
    unnamed = [
        f"{library}:{name}"
        for library, source in SOURCES.items()
        for name, body in functions(source).items()
        if name in registered(source) and not any("KEYS" in line for line in body[: block(body)])
    ]
    assert unnamed == []


def test_the_check_sees_every_registered_function() -> None:
    seen = {library: len(registered(source) & set(functions(source))) for library, source in SOURCES.items()}
    assert seen == {"sessions": 13, "coordination": 17, "usage": 1}
