"""The Prometheus alert rules of deploy/prometheus: promtool checks and unit-tests them, compose's Prometheus
loads them, the Helm chart ships them as a PrometheusRule, and they query only metrics a live daemon exports."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from memento_sessions.server.daemon import Daemon
from tests import tools
from tests.test_deploy import CI_VALUES, ROOT, active_services, exported, need, render, yaml_module

pytestmark = pytest.mark.topology_independent  # files and a scrape: the same on either Redis

PROMETHEUS = ROOT / "deploy" / "prometheus"
ALERTS = {"MementoDaemonDown", "MementoBackendDown", "MementoBackendErrors", "MementoSlowConsumersClosed",
          "MementoSnapshotsPending", "MementoSessionLimitsHit", "MementoEmbeddedRestarts"}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    binary: str = need(tools.promtool)
    return subprocess.run([binary, *args], cwd=PROMETHEUS, capture_output=True, text=True, timeout=60, check=False)


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml_module().safe_load((PROMETHEUS / "alerts.yml").read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_prometheus_config_and_its_alert_rules_pass_promtool() -> None:
    done = promtool("check", "config", "prometheus.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 rule files found" in done.stdout and f"{len(ALERTS)} rules found" in done.stdout
    assert {rule["alert"] for rule in alert_rules()} == ALERTS


def test_every_alert_fires_in_promtools_unit_tests() -> None:
    done = promtool("test", "rules", "alerts.test.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    cases = yaml_module().safe_load((PROMETHEUS / "alerts.test.yml").read_text())["tests"]
    fired = {case["alertname"] for test in cases for case in test["alert_rule_test"] if case["exp_alerts"]}
    quiet = {case["alertname"] for test in cases for case in test["alert_rule_test"] if not case["exp_alerts"]}
    assert fired == ALERTS
    assert len(quiet) >= 4  # and some are shown not to fire before their condition holds


def test_compose_prometheus_loads_the_alert_rules() -> None:
    config = yaml_module().safe_load((PROMETHEUS / "prometheus.yml").read_text())
    mounts = dict(volume.split(":")[:2] for volume in active_services()["prometheus"]["volumes"]
                  if isinstance(volume, str) and volume.startswith(("/", ".")))
    mounted = {target: (ROOT / source).resolve() for source, target in mounts.items()}
    for rule_file in config["rule_files"]:
        assert mounted[f"/etc/prometheus/{rule_file}"] == (PROMETHEUS / rule_file).resolve()


@pytest.mark.anyio
async def test_alerts_query_only_metrics_the_daemon_exports(daemon: Daemon) -> None:
    names, _ = await exported(daemon)
    queried = {name for rule in alert_rules() for name in re.findall(r"\bmemento_[a-z_]+", rule["expr"])}
    assert len(queried) == 6
    assert queried - names == set()


def test_the_charts_prometheus_rule_is_the_alert_rules_for_its_own_job(tmp_path: Path) -> None:
    rendered = render("-f", str(CI_VALUES))
    rule = rendered["PrometheusRule"]
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    service = rendered["Service"]["metadata"]["name"]  # a ServiceMonitor's scrape job is named after it
    shipped = (PROMETHEUS / "alerts.yml").read_text().replace('job="memento-sessions"', f'job="{service}"')
    assert rule["spec"]["groups"] == yaml_module().safe_load(shipped)["groups"]
    assert f'up{{job="{service}"}} == 0' in [r["expr"] for group in rule["spec"]["groups"] for r in group["rules"]]
    rules_file = tmp_path / "rules.yml"
    rules_file.write_text(yaml_module().safe_dump({"groups": rule["spec"]["groups"]}))
    done = promtool("check", "rules", str(rules_file))
    assert done.returncode == 0 and f"{len(ALERTS)} rules found" in done.stdout, done.stdout + done.stderr
