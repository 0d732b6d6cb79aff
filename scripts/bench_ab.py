#!/usr/bin/env python3
"""Two checkouts' benchmarks on the same host, alternated: is a change within the host's noise?

Runs `scripts/bench.py --only SECTIONS` of each checkout in turn, ROUNDS times each, the order swapped
every round (before, after; after, before; ...) so that a host growing busier or quieter weighs on both
alike. Each checkout runs its own bench with its own code (PYTHONPATH set to it, for the daemon process
too) in the same virtualenv. Then, per figure, the median of each side and its spread (lowest to highest
run), for the value and for the ratio to the floor measured in the same run, and whether the medians
differ by more than the runs of either side spread: "within noise" when they do not.

    git worktree add /tmp/before <commit>
    .venv/bin/python scripts/bench_ab.py --before /tmp/before --after .            # emit sections, 3 rounds
    .venv/bin/python scripts/bench_ab.py --before /tmp/before --after . --rounds 2 --only host ws-ingest

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


def number(value: float) -> str:
    """A value to the precision a reader compares by."""
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.2f}" if abs(value) >= 1 else f"{value:.3f}"


def spread(values: list[float]) -> str:
    """`5,432 (5,100-5,610)`: the median and the lowest to highest."""
    if not values:
        return "-"
    return f"{number(statistics.median(values))} ({number(min(values))}-{number(max(values))})"


def verdict(before: list[float], after: list[float]) -> str:
    """Within noise when the medians differ by no more than either side's runs spread."""
    if not before or not after:
        return "-"
    gap = statistics.median(after) - statistics.median(before)
    noise = max(max(before) - min(before), max(after) - min(after))
    change = f"{100 * gap / statistics.median(before):+.1f} %" if statistics.median(before) else ""
    return f"within noise ({change})" if abs(gap) <= noise else f"**outside noise** ({change})"


def report(runs: list[Run]) -> str:
    """The markdown: the runs (load, steal), then one row per figure."""
    lines = ["| run | side | load average at start | steal (ms) | took (s) |", "|---|---|---|---|---|"]
    lines += [f"| {r.round} | {r.side} | {r.load:.2f} | {r.steal_ms:,.0f} | {r.took_s:.0f} |" for r in runs]
    lines += ["", "| figure | unit | before: median (range) | after: median (range) | after vs before | "
              "ratio to floor, before | ratio to floor, after | ratio: after vs before |",
              "|---|---|---|---|---|---|---|---|"]
    units = {name: figure["unit"] for run in runs for name, figure in run.figures.items()}
    for name, sides in collect(runs).items():
        before, after = sides["before"], sides["after"]
        lines.append(f"| {name} | {units[name]} | {spread(before.values)} | {spread(after.values)} | "
                     f"{verdict(before.values, after.values)} | {spread(before.ratios)} | {spread(after.ratios)} | "
                     f"{verdict(before.ratios, after.ratios)} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    """Parse the command line, run the rounds, print the markdown."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, required=True, help="the checkout of the code before")
    parser.add_argument("--after", type=Path, required=True, help="the checkout of the code after")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each side (default 3)")
    parser.add_argument("--only", nargs="+", default=EMIT_SECTIONS,
                        help=f"the sections (default: {' '.join(EMIT_SECTIONS)})")
    parser.add_argument("--python", default=sys.executable, help="the virtualenv's python (default this one)")
    parser.add_argument("--save", type=Path, help="also write every run's figures as JSON here (logs beside it)")
    args = parser.parse_args()
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
