"""What a run leaves: the table and the JSON line it prints, and (--markdown) the table of today's figures.

The markdown is the part of docs/benchmarks.md between MARK_START and MARK_END: each figure beside its
floor, the ratio, its target and whether it met it, the section's steal, and the `--only` that measures it
again; above the table the run's date, commit, command, length and the host's load and steal. With a file
that holds the marks only that part is replaced; a file without them is written whole (a new one) or refused.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shlex
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.harness import Figure
from bench.numbers import number
from bench.watch import steal_ms

MARK_START = "<!-- scripts/bench.py --markdown: from here to the end mark, the run's own words -->"
MARK_END = "<!-- scripts/bench.py --markdown: end -->"
WIDTH = 110  # the heading's lines, as docs/ wraps its prose
PEERS_COMMAND = "--peers --only emit emit-64"  # what a peer row (section "peers") is measured again with


def show(figures: list[Figure]) -> None:
    """The table, then the JSON line."""
    print(f"\n{'figure':<58} {'value':>12} {'floor':>12} {'ratio':>7}  target / met")
    for f in figures:
        floor = f"{f.floor:,.1f}" if f.floor else "-"
        ratio = f"{f.ratio:.2f}" if f.ratio else "-"
        met = {True: "yes", False: "NO", None: ""}[f.met]
        target = f.target.text if f.target else ""
        print(f"{f.name:<58} {f.value:>12,.2f} {floor:>12} {ratio:>7}  {target} {met}  [{f.unit}]")
        if f.extra:
            print(f"{'':<58} " + ", ".join(f"{k}={v:,.2f}" for k, v in f.extra.items() if k != "floor_is"))
    print(json.dumps({"bench": [f.as_json() for f in figures]}))


@dataclass
class Run:
    """The run as the markdown's heading tells it: when, on what commit, with what, and how busy the host was."""

    command: str = field(default_factory=lambda: shlex.join([".venv/bin/python", "scripts/bench.py", *sys.argv[1:]]))
    commit: str = field(default_factory=lambda: checkout_commit())  # at the start: the code that is measured
    started: float = field(default_factory=time.time)
    steal_at_start: float = field(default_factory=steal_ms)
    loads: list[float] = field(default_factory=lambda: [os.getloadavg()[0]])  # 1-minute, at each section's start
    took_s: float = 0.0
    steal_total_ms: float = 0.0

    def section_started(self) -> None:
        """Note the host's load as a section starts."""
        self.loads.append(os.getloadavg()[0])

    def finish(self) -> None:
        """Note the run's length and the host's steal over it, once the last section is timed."""
        self.took_s = time.time() - self.started
        self.steal_total_ms = steal_ms() - self.steal_at_start
        self.loads.append(os.getloadavg()[0])


def value_text(value: float, unit: str, p50: float | None = None) -> str:
    """`5,432 events/s`, `2.92 ms (p50 2.11)`: a figure in the table, its median beside a latency."""
    return f"{number(value)} {unit}" + (f" (p50 {number(p50)})" if p50 is not None else "")


def row(figure: Figure) -> str:
    """One figure as a markdown table row."""
    value = "failed" if math.isnan(figure.value) else value_text(figure.value, figure.unit, figure.extra.get("p50_ms"))
    floor = value_text(figure.floor, figure.unit, figure.extra.get("floor_p50_ms")) if figure.floor else "-"
    ratio = f"{figure.ratio:.2f}" if figure.ratio else "-"
    met = {True: "yes", False: "**no**", None: "-"}[figure.met]
    target = figure.target.text if figure.target else "-"
    steal = figure.extra.get("section_steal_ms")
    again = PEERS_COMMAND if figure.section == "peers" else f"--only {figure.section}"
    cells = [figure.name, value, floor, ratio, target, met, "-" if steal is None else f"{steal:,.0f}", f"`{again}`"]
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def checkout_commit() -> str:
    """The checkout's commit, short, `+ changes` when its files differ from it; `unknown` outside git."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" + uncommitted changes" if dirty else "")


def heading(figures: list[Figure], run: Run) -> str:
    """The paragraph above the table: the run, the host, and how to read the last columns."""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(run.started))
    sections = list(dict.fromkeys(f.section for f in figures))
    steals = {f.section: f.extra.get("section_steal_ms", 0.0) for f in figures}
    worst = max(steals, key=lambda name: steals[name]) if steals else ""
    host = [f.value for f in figures if f.section == "host"]
    judged = [f for f in figures if f.met is not None]
    met = sum(1 for f in judged if f.met)
    took = f"{run.took_s / 60:.1f} min" if run.took_s >= 120 else f"{run.took_s:.0f} s"
    text = (
        f"The run of {when} at commit {run.commit}: `{run.command}`, {took}, "
        f"{len(sections)} sections, {len(figures)} figures, {met} of {len(judged)} targets met. "
        f"Host: {os.cpu_count()} vCPUs, {platform.python_implementation()} {platform.python_version()}; "
        f"load average (1 min) {min(run.loads):.2f} to {max(run.loads):.2f} at the sections' starts; the "
        f"host took {run.steal_total_ms:,.0f} ms of vCPU time (steal) over the run, at most "
        f"{steals.get(worst, 0.0):,.0f} ms in one section (`{worst}`)"
        + (f"; the host's bare round trip p99 {number(host[0])} ms" if host else "") + "."
    )
    reading = ("The value and the floor are measured in the same run, on the same servers; ratio = value / floor "
               "(for the peer rows memento / peer). Steal is the section's, ms summed over the vCPUs. A row's last "
               "column measures it again: `.venv/bin/python scripts/bench.py` with those arguments.")
    return "\n\n".join(textwrap.fill(part, WIDTH, break_long_words=False, break_on_hyphens=False)
                       for part in (text, reading))


def markdown(figures: list[Figure], run: Run) -> str:
    """The marked part: the heading, then one row per figure."""
    lines = [MARK_START, "", heading(figures, run), "",
             "| figure | value | floor | ratio | target | met | steal (ms) | again |",
             "|---|---|---|---|---|---|---|---|", *(row(f) for f in figures), "", MARK_END]
    return "\n".join(lines) + "\n"


def check_markdown_file(path: Path) -> None:
    """Refuse, before the run, a file that exists without both marks (it would be overwritten whole)."""
    if path.exists():
        text = path.read_text()
        if MARK_START not in text or MARK_END not in text:
            raise SystemExit(f"bench: {path} exists without the marks {MARK_START!r} and {MARK_END!r}; "
                             "give a new file or add the marks where the table goes")


def write_markdown(path: Path, figures: list[Figure], run: Run) -> None:
    """The marked part of `path` replaced by this run's (the whole file when it is new)."""
    part = markdown(figures, run)
    if path.exists():
        text = path.read_text()
        before, _, rest = text.partition(MARK_START)
        _, _, after = rest.partition(MARK_END)
        part = before + part.removesuffix("\n") + after
    path.write_text(part)
    print(f"bench: wrote the table of {len(figures)} figures to {path}", file=sys.stderr, flush=True)
