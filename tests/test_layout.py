"""The package layout holds: a package imports only from packages below it, so no two packages form a cycle.

Every import statement of every module counts, including those inside functions and under TYPE_CHECKING:
a lazy import is still a dependency. docs/layout.md says why the order is the one below.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import memento_sessions

ROOT = Path(memento_sessions.__file__).parent
# Bottom first. Packages on one rank must not import each other.
RANKS: list[set[str]] = [
    {"ground"},  # the modules of the package root
    {"ingest"},  # pure converters and the reducer: the client and the daemon both fold with it
    {"redisio", "embedded", "client", "dashboard", "usage"},
    {"sessions"},  # live sessions
    {"history"},  # event sourcing over them
    {"lifecycle"},  # sessions moved to Postgres and back, forked, read where they are stored
    {"kg"},
    {"checkpoints", "coordination"},
    {"bridge"},
    {"api"},  # every method declared once: binds the rooms' methods, read by the transports
    {"ws", "mcp"},
    {"server"},
    {"cli"},
]
RANK = {package: rank for rank, packages in enumerate(RANKS) for package in packages}


def package_of(module: str) -> str:
    """The package a dotted module name (below memento_sessions) belongs to."""
    parts = module.split(".")
    if len(parts) > 1 or (ROOT / parts[0]).is_dir():
        return parts[0]
    return "ground"


def imported(path: Path) -> Iterator[tuple[int, str]]:
    """(line, module below memento_sessions) of every import of the package in one file."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}:{node.lineno}: relative import"
            if node.module == "memento_sessions":
                yield from ((node.lineno, alias.name) for alias in node.names)
            elif node.module and node.module.startswith("memento_sessions."):
                yield node.lineno, node.module.removeprefix("memento_sessions.")
        elif isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name.removeprefix("memento_sessions.")) for alias in node.names
                        if alias.name.startswith("memento_sessions."))


def edges() -> Iterator[tuple[str, str, str]]:
    """(importing package, imported package, where) for every import that crosses a package boundary."""
    for path in sorted(ROOT.rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        source = package_of(module)
        for line, target in imported(path):
            if target == "__version__":
                target = "__init__"
            if package_of(target) != source:
                yield source, package_of(target), f"{path.relative_to(ROOT)}:{line} imports {target}"


def test_every_package_has_a_rank() -> None:
    packages = {path.parent.name for path in ROOT.glob("*/__init__.py")}
    assert packages <= set(RANK), f"place the new package in RANKS: {sorted(packages - set(RANK))}"
    assert packages == set(RANK) - {"ground"}


def test_no_package_imports_one_above_or_beside_it() -> None:
    wrong = [where for source, target, where in edges() if RANK[target] >= RANK[source]]
    assert wrong == []


def test_no_cycle_between_packages() -> None:
    graph: dict[str, set[str]] = {}
    for source, target, _ in edges():
        graph.setdefault(source, set()).add(target)
    done: set[str] = set()

    def visit(package: str, path: tuple[str, ...]) -> None:
        assert package not in path, f"cycle: {' -> '.join((*path, package))}"
        if package not in done:
            for target in sorted(graph.get(package, ())):
                visit(target, (*path, package))
            done.add(package)

    for package in sorted(graph):
        visit(package, ())
    assert done == set(RANK), "every package imports or is imported"


def test_the_checks_see_the_imports_they_judge() -> None:
    """The walk finds lazy and TYPE_CHECKING imports and all three import forms (else the tests above pass
    whatever the code does)."""
    found = {(source, target, where.split(":")[0], where.split(" imports ")[1]) for source, target, where in edges()}
    assert ("cli", "server", "cli/commands.py", "server.daemon") in found  # inside a function
    assert ("checkpoints", "checkpoints", "checkpoints/commands.py", "checkpoints.retention") not in found
    assert ("kg", "embedded", "kg/commands.py", "embedded.redis") in found  # inside a function
    assert ("ws", "ground", "ws/subscriptions.py", "keys") in found  # from memento_sessions import keys
    assert ("server", "ws", "server/daemon.py", "ws.gateway") in found  # import memento_sessions.ws.gateway
    assert ("ground", "ground", "settings.py", "errors") not in found  # within a package: not an edge


def test_the_package_root_holds_at_most_twelve_modules() -> None:
    """The ground stays small: what belongs to one room goes into that room's package."""
    modules = sorted(path.name for path in ROOT.glob("*.py"))
    assert len(modules) <= 12, modules


def test_each_package_docstring_names_its_files() -> None:
    """A room's `__init__.py` is its map: every module (and Lua library) in it is named there."""
    missing = []
    for init in sorted(ROOT.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        files = sorted(path.name for path in init.parent.iterdir()
                       if path.suffix in (".py", ".lua") and path.name not in ("__init__.py", "__main__.py"))
        missing += [f"{init.parent.name}/{name}" for name in files if name not in doc]
    assert missing == []


def test_the_package_docstring_names_every_package() -> None:
    """The root's docstring draws the order: every package is in it, in the order of RANKS."""
    doc = ast.get_docstring(ast.parse((ROOT / "__init__.py").read_text())) or ""
    packages = [package for packages in RANKS[1:] for package in sorted(packages)]
    assert [package for package in packages if f"{package}/" not in doc] == []
    firsts = [min(doc.index(f"{package}/") for package in packages) for packages in RANKS[1:]]
    assert firsts == sorted(firsts)
