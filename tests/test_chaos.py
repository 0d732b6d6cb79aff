"""scripts/chaos.py, briefly: two daemon processes on one Redis, every kind of chaos, nothing lost or doubled."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "chaos.py"
EVENTS = 4_000
KINDS = {"pubsub_kill", "cut_subscribers", "redis_sigterm", "redis_sigkill", "daemon_sigkill"}


def run_chaos(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    """Run the script; its exit code, its JSON line, and its whole output (for the failure message)."""
    done = subprocess.run([sys.executable, str(SCRIPT), "--workdir", str(tmp_path / "chaos"), *args],
                          capture_output=True, text=True, timeout=150, check=False)
    output = done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no JSON line; exit {done.returncode}:\n{output[-4000:]}"
    return done.returncode, json.loads(lines[-1]), output


def test_chaos_run_loses_and_doubles_nothing(tmp_path: Path) -> None:
    # ~16 s of emitting at 250 events/s: time for one whole rotation of the actions (0.7 s apart)
    code, result, output = run_chaos(tmp_path, "--events", str(EVENTS), "--rate", "250", "--interval", "0.7",
                                     "--subscribers", "1", "--settle", "30", "--max-seconds", "120")
    tail = output[-3000:]
    assert set(result["chaos"]) == KINDS, tail  # every kind of chaos happened during the run
    assert result["appendfsync"] == "always"
    store = result["store"]
    assert (store["acked"], store["stored"], store["last_seq"]) == (EVENTS, EVENTS, EVENTS), tail
    assert (store["lost"], store["doubled"], store["gaps"], store["seq_reused"]) == (0, 0, 0, 0), tail
    assert store["acked_seq_moved"] == store["seq_changed_on_retry"] == 0, tail
    assert len(result["subscribers"]) == 2
    for sub in result["subscribers"]:
        assert (sub["received"], sub["missing"], sub["doubled"], sub["out_of_order"], sub["mismatched"]) == (
            EVENTS, 0, 0, 0, 0), (sub, tail)
    assert sum(sub["reconnects"] for sub in result["subscribers"]) >= 1, "the cuts and kills reached no subscriber"
    assert result["target_met"] is True and code == 0, tail


def test_help_explains_the_options() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=30,
                          check=True)
    for option in ("--events", "--rate", "--fsync", "--interval", "--max-seconds", "--subscribers", "--actions"):
        assert option in done.stdout
    assert "appendfsync always" in done.stdout

