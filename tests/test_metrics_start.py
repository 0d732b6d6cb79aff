"""A daemon's /metrics from its first scrape: every labelled counter has its known label values at 0."""

from __future__ import annotations

import subprocess
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.topology_independent  # no Redis involved

# What a fresh process that imports the whole daemon exports, before anything happened.
_SCRAPE = """
import memento_sessions.server.daemon
import memento_sessions.server.services  # what the daemon imports as it starts: every module that binds a metric
from prometheus_client import REGISTRY, generate_latest
print(generate_latest(REGISTRY).decode())
"""


def first_scrape() -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    done = subprocess.run([sys.executable, "-c", _SCRAPE], capture_output=True, text=True, timeout=60, check=True)
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(done.stdout):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def test_the_first_failure_counters_have_zero_samples_before_it() -> None:
    samples = first_scrape()
    assert samples["memento_embedded_restarts_total"] == {(("server", "redis"),): 0.0, (("server", "postgres"),): 0.0}
    assert samples["memento_backend_errors_total"] == {
        (("backend", name),): 0.0 for name in ("redis", "falkordb", "postgres")}
    assert samples["memento_session_limit_refusals_total"] == {
        (("reason", reason),): 0.0 for reason in ("session_full", "namespace_full")}
    assert len(samples["memento_ws_refused_total"]) == 4
    assert len(samples["memento_mcp_session_limit_total"]) == 2


def test_every_labelled_counter_has_a_sample_at_start() -> None:
    from memento_sessions import metrics

    samples = first_scrape()
    labelled = [value for value in vars(metrics).values()
                if type(value).__name__ == "Counter" and value._labelnames]
    assert len(labelled) >= 12
    empty = [counter._name for counter in labelled if not samples.get(f"{counter._name}_total")]
    assert empty == []
