#!/usr/bin/env python3
"""Two checkouts' benchmarks on the same host, alternated: is a change within the host's noise?

Runs `scripts/bench.py --only SECTIONS` of each checkout in turn, ROUNDS times each, the order swapped
every round (before, after; after, before; ...) so that a host growing busier or quieter weighs on both
alike. Each checkout runs its own bench with its own code (PYTHONPATH set to it, for the daemon process
too) in the same virtualenv. Then, per figure, the median of each side and its spread (lowest to highest
run), after / before within each round (the two runs minutes apart, so the host's drift cancels), and the
ratio to the floor measured in the same run. "within noise" when after / before is above 1 in some rounds
and below it in others; otherwise the change held in every round.

    git worktree add /tmp/before <commit>
    .venv/bin/python scripts/bench_ab.py --before /tmp/before --after .            # emit sections, 3 rounds
    .venv/bin/python scripts/bench_ab.py --before /tmp/before --after . --rounds 2 --only host ws-ingest
    .venv/bin/python scripts/bench_ab.py --report runs.json    # the table again from a run's --save

The virtualenv must hold both checkouts' dependencies (the before checkout's own bench imports them).
Each run's stderr (the sections' steal, GC pauses and stalls) goes to a log file beside --save's, or to
a temporary directory, whose path is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.numbers import number  # scripts/ is on the path: this file runs as scripts/bench_ab.py

EMIT_SECTIONS = ["host", "emit", "emit-64", "batch", "ws-ingest", "emit-leases"]
SIDES = ("before", "after")


@dataclass
class Run:
    """One bench run of one side: its figures by name, the host's load at its start and its steal."""

    side: str
    round: int
    figures: dict[str, dict[str, Any]]
    load: float
    steal_ms: float
    took_s: float


@dataclass
class Side:
    """One side's values of one figure over its runs."""

    values: list[float] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)


def steal_ms() -> float:
    """The host's steal so far, ms summed over the vCPUs (0 off Linux)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return 0.0
    return int(fields[8]) * 1000 / os.sysconf("SC_CLK_TCK") if len(fields) > 8 else 0.0


def bench_once(side: str, tree: Path, number: int, args: argparse.Namespace, logs: Path) -> Run:
    """Run `tree`'s bench once; its figures from the JSON line it prints last."""
    load, stolen, started = os.getloadavg()[0], steal_ms(), time.perf_counter()
    log = logs / f"{number:02d}-{side}.log"
    print(f"bench_ab: round {number}, {side} ({tree}), load average {load:.2f} ...", file=sys.stderr, flush=True)
    with log.open("w") as err:
        done = subprocess.run([args.python, str(tree / "scripts" / "bench.py"), "--only", *args.only], cwd=tree,
                              env={**os.environ, "PYTHONPATH": str(tree)}, stdout=subprocess.PIPE, stderr=err,
                              text=True, check=False)
    if done.returncode:
        raise SystemExit(f"bench_ab: the {side} run failed ({done.returncode}); see {log}")
    line = next(text for text in reversed(done.stdout.splitlines()) if text.startswith('{"bench"'))
    figures = {figure["name"]: figure for figure in json.loads(line)["bench"]}
    return Run(side, number, figures, load, steal_ms() - stolen, time.perf_counter() - started)


def order(round_number: int) -> tuple[str, str]:
    """before, after in odd rounds; after, before in even ones."""
    return SIDES if round_number % 2 else (SIDES[1], SIDES[0])


def collect(runs: list[Run]) -> dict[str, dict[str, Side]]:
    """Per figure (in the order the runs give them), per side, its values and ratios to the floor."""
    table: dict[str, dict[str, Side]] = {}
    for run in runs:
        for name, figure in run.figures.items():
            side = table.setdefault(name, {s: Side() for s in SIDES})[run.side]
            side.values.append(float(figure["value"]))
            if figure.get("ratio") is not None:
                side.ratios.append(float(figure["ratio"]))
    return table


def paired(runs: list[Run], name: str) -> list[float]:
    """after / before of the figure's value within each round that has both."""
    by_round: dict[int, dict[str, float]] = {}
    for run in runs:
        if name in run.figures:
            by_round.setdefault(run.round, {})[run.side] = float(run.figures[name]["value"])
    return [sides["after"] / sides["before"] for sides in by_round.values() if sides.get("before") and "after" in sides]


def spread(values: list[float]) -> str:
    """`5,432 (5,100-5,610)`: the median and the lowest to highest."""
    if not values:
        return "-"
    return f"{number(statistics.median(values))} ({number(min(values))}-{number(max(values))})"


def verdict(ratios: list[float], higher_is_better: bool) -> str:
    """Within noise when after / before falls on both sides of 1 over the rounds; else which way it held."""
    if not ratios:
        return "-"
    if min(ratios) <= 1 <= max(ratios):
        return "within noise"
    better = (min(ratios) > 1) == higher_is_better
    return f"**{'better' if better else 'worse'} in every round**"


def report(runs: list[Run]) -> str:
    """The markdown: the runs (load, steal), then one row per figure."""
    lines = ["| round | side | load average at start | steal (ms) | took (s) |", "|---|---|---|---|---|"]
    lines += [f"| {r.round} | {r.side} | {r.load:.2f} | {r.steal_ms:,.0f} | {r.took_s:.0f} |" for r in runs]
    lines += ["", "| figure | unit | before: median (range) | after: median (range) | after / before, per round: "
              "median (range) | verdict | ratio to floor, before | ratio to floor, after |",
              "|---|---|---|---|---|---|---|---|"]
    shown = {name: figure for run in runs for name, figure in run.figures.items()}
    for name, sides in collect(runs).items():
        before, after, ratios = sides["before"], sides["after"], paired(runs, name)
        lower_is_better = shown[name]["unit"].startswith("ms") or not shown[name].get("higher_is_better", True)
        lines.append(f"| {name} | {shown[name]['unit']} | {spread(before.values)} | {spread(after.values)} | "
                     f"{spread(ratios)} | {verdict(ratios, not lower_is_better)} | {spread(before.ratios)} | "
                     f"{spread(after.ratios)} |")
    return "\n".join(lines) + "\n"


def saved(files: list[Path]) -> list[Run]:
    """The runs of --save files, each file's rounds numbered on from the last file's."""
    runs: list[Run] = []
    for file in files:
        offset = max((run.round for run in runs), default=0)
        runs += [Run(**{**run, "round": run["round"] + offset}) for run in json.loads(file.read_text())]
    return runs


def main() -> None:
    """Parse the command line, run the rounds, print the markdown."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, help="the checkout of the code before")
    parser.add_argument("--after", type=Path, help="the checkout of the code after")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each side (default 3)")
    parser.add_argument("--only", nargs="+", default=EMIT_SECTIONS,
                        help=f"the sections (default: {' '.join(EMIT_SECTIONS)})")
    parser.add_argument("--python", default=sys.executable, help="the virtualenv's python (default this one)")
    parser.add_argument("--save", type=Path, help="also write every run's figures as JSON here (logs beside it)")
    parser.add_argument("--report", type=Path, nargs="+", metavar="SAVED",
                        help="only print the table of runs' --save files (their rounds one after another)")
    args = parser.parse_args()
    if args.report:
        print(report(saved(args.report)))
        return
    if not args.before or not args.after:
        parser.error("--before and --after are needed (or --report)")
    args.before, args.after = args.before.resolve(), args.after.resolve()
    logs = args.save.parent if args.save else Path(tempfile.mkdtemp(prefix="bench-ab-"))
    print(f"bench_ab: each run's stderr in {logs}", file=sys.stderr, flush=True)
    runs = []
    for round_number in range(1, args.rounds + 1):
        for side in order(round_number):
            tree = args.before if side == "before" else args.after
            runs.append(bench_once(side, tree, round_number, args, logs))
    if args.save:
        args.save.write_text(json.dumps([vars(run) for run in runs], indent=1))
    print(report(runs))


if __name__ == "__main__":
    main()
