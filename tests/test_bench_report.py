"""scripts/bench.py --markdown (the table of today's figures between the marks of docs/benchmarks.md),
scripts/bench_ab.py (two checkouts' runs, paired by round) and the bench's lean caller."""

from __future__ import annotations

import asyncio
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))  # the bench package, as bench.py runs it

import bench_ab
from bench.harness import Figure, Target
from bench.receivers import LeanCaller
from bench.report import MARK_END, MARK_START, Run, check_markdown_file, row, write_markdown

pytestmark = pytest.mark.topology_independent
DOCS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


def judged(figure: Figure, section: str, steal: float = 10.0) -> Figure:
    """The figure as the run leaves it: its section named, its steal noted, its target judged."""
    figure.section = section
    figure.extra["section_steal_ms"] = steal
    figure.judge()
    return figure


def emit_figure() -> Figure:
    return judged(Figure("emit, in-process, sequential", "events/s", 1400.0, 1000.0,
                         Target.ratio_at_least(0.7, "bare FCALL")), "emit")


def latency_figure() -> Figure:
    figure = Figure("lease.acquire p99", "ms p99", 2.5, 1.0, Target.below_ms(2),
                    extra={"p50_ms": 0.61, "floor_p50_ms": 0.2})
    return judged(figure, "lease-acquire", steal=1234.0)


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def test_a_row_holds_the_figure_its_floor_ratio_target_verdict_steal_and_command() -> None:
    assert cells(row(emit_figure())) == [
        "emit, in-process, sequential", "1,400 events/s", "1,000 events/s", "1.40", ">= 0.7 x floor (bare FCALL)",
        "yes", "10", "`--only emit`"]
    assert cells(row(latency_figure())) == [
        "lease.acquire p99", "2.50 ms p99 (p50 0.610)", "1.00 ms p99 (p50 0.200)", "2.50", "p99 < 2 ms", "**no**",
        "1,234", "`--only lease-acquire`"]
    peer = Figure("memento / ADK, seq", "events/s", 5000.0, 150.0, Target.ratio_at_least(25, of="peer"))
    peer = judged(peer, "peers")
    assert cells(row(peer))[3:] == ["33.33", ">= 25 x peer", "yes", "10", "`--peers --only emit emit-64`"]


def test_a_section_that_failed_is_a_row_that_says_so() -> None:
    failed = Figure("noisy-neighbour: the section failed (ResponseError)", "", math.nan, None, extra={"failed": 1.0})
    failed = judged(failed, "noisy-neighbour")
    failed.met = False  # as the run sets it
    assert cells(row(failed))[1:6] == ["failed", "-", "-", "-", "**no**"]


def test_only_the_marked_part_is_replaced_and_the_heading_tells_the_run(tmp_path: Path) -> None:
    page = tmp_path / "benchmarks.md"
    page.write_text(f"# Benchmarks\n\nwords above\n\n{MARK_START}\n| old | table |\n{MARK_END}\n\n## Method\nbelow\n")
    run = Run(command=".venv/bin/python scripts/bench.py --markdown docs/benchmarks.md", commit="abc1234",
              loads=[1.5, 3.0, 2.25], took_s=540.0, steal_total_ms=4321.0)
    write_markdown(page, [emit_figure(), latency_figure()], run)
    write_markdown(page, [emit_figure(), latency_figure()], run)  # again: still one table
    text = page.read_text()
    assert text.startswith("# Benchmarks\n\nwords above\n\n" + MARK_START)
    assert text.endswith(MARK_END + "\n\n## Method\nbelow\n")
    assert "| old | table |" not in text
    assert text.count(MARK_START) == text.count(MARK_END) == 1
    assert text.count("| emit, in-process, sequential |") == 1
    prose = " ".join(text.split())
    for said in ("at commit abc1234", "`.venv/bin/python scripts/bench.py --markdown docs/benchmarks.md`", "9.0 min",
                 "2 sections, 2 figures, 1 of 2 targets met", "load average (1 min) 1.50 to 3.00",
                 "4,321 ms of vCPU time (steal)", "at most 1,234 ms in one section (`lease-acquire`)"):
        assert said in prose


def test_a_new_file_is_written_whole_and_a_file_without_marks_is_refused(tmp_path: Path) -> None:
    new = tmp_path / "today.md"
    check_markdown_file(new)
    write_markdown(new, [emit_figure()], Run(commit="abc1234", loads=[1.0], took_s=5.0))
    assert new.read_text().startswith(MARK_START) and new.read_text().endswith(MARK_END + "\n")
    unmarked = tmp_path / "notes.md"
    unmarked.write_text("# Notes a run must not overwrite\n")
    with pytest.raises(SystemExit):
        check_markdown_file(unmarked)
    assert unmarked.read_text() == "# Notes a run must not overwrite\n"


def test_the_docs_page_holds_the_marks_the_run_writes_between() -> None:
    check_markdown_file(DOCS)
    text = DOCS.read_text()
    assert text.index(MARK_START) < text.index(MARK_END)


def test_bench_ab_pairs_each_round_and_calls_a_change_within_noise_only_when_the_rounds_disagree() -> None:
    def run(side: str, round_number: int, rate: float, p99: float) -> bench_ab.Run:
        figures = {"emit": {"value": rate, "unit": "events/s", "ratio": rate / 1000},
                   "p99": {"value": p99, "unit": "ms", "ratio": None, "higher_is_better": False}}
        return bench_ab.Run(side, round_number, figures, load=1.0, steal_ms=0.0, took_s=20.0)

    runs = [run("before", 1, 1000, 2.0), run("after", 1, 1100, 1.0), run("after", 2, 900, 1.5),
            run("before", 2, 1000, 3.0)]
    assert bench_ab.paired(runs, "emit") == pytest.approx([1.1, 0.9])
    assert bench_ab.verdict(bench_ab.paired(runs, "emit"), higher_is_better=True) == "within noise"
    assert bench_ab.verdict(bench_ab.paired(runs, "p99"), higher_is_better=False) == "**better in every round**"
    assert bench_ab.verdict([0.8, 0.9], higher_is_better=True) == "**worse in every round**"
    table = bench_ab.report(runs)
    assert "| emit | events/s | 1,000 (1,000-1,000) | 1,000 (900.0-1,100) | 1.00 (0.900-1.10) | within noise |" in table
    assert [bench_ab.order(n) for n in (1, 2, 3)] == [("before", "after"), ("after", "before"), ("before", "after")]


def server_frame(message: dict[str, Any]) -> bytes:
    """A text frame as the daemon sends it (unmasked, under 126 bytes)."""
    payload = json.dumps(message).encode()
    assert len(payload) < 126
    return bytes([0x81, len(payload)]) + payload


@pytest.mark.anyio
async def test_a_lean_callers_reply_is_the_reply_not_a_notification_pushed_before_it() -> None:
    caller = LeanCaller()
    caller.data_received(b"HTTP/1.1 101 Switching Protocols\r\n\r\n")
    caller.waiting = asyncio.get_running_loop().create_future()
    receipt = {"jsonrpc": "2.0", "method": "mailbox.receipt", "params": {"messageId": "m1", "stage": "pushed"}}
    reply = {"jsonrpc": "2.0", "id": 1, "result": {"messageId": "m1"}}
    caller.data_received(server_frame(receipt) + server_frame(reply))
    assert json.loads(await caller.waiting) == reply
