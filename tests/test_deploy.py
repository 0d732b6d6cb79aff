"""Deployment artifacts, validated offline: the Dockerfile, docker-compose.yml (both profiles), the Helm chart
(lint, render, Kubernetes schemas) and the Grafana dashboard against a live daemon's /metrics.

The tools come from tests/tools.py (installed once); a test skips, loudly, only where one cannot be had.
"""

from __future__ import annotations

import copy
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from memento_sessions.embedded.process import free_port
from memento_sessions.server.daemon import Daemon
from memento_sessions.settings import Settings, load_settings
from tests import tools

ROOT = tools.ROOT
CHART = ROOT / "helm" / "memento-sessions"
CI_VALUES = CHART / "ci" / "cluster-values.yaml"
GITOPS_VALUES = CHART / "ci" / "gitops-values.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "memento-sessions.json"
SECRET = "compose-test-secret-0123456789-0123456789"
PASSWORDS = {"REDIS_PASSWORD": "redispw0123456789", "FALKORDB_PASSWORD": "falkorpw0123456789",
             "POSTGRES_PASSWORD": "pgpw0123456789", "GRAFANA_ADMIN_PASSWORD": "grafanapw0123456789"}
CLUSTER_URL = "redis+cluster://:redispw0123456789@redis-node-1:6379,redis-node-2:6379,redis-node-3:6379"
COMPOSE_REDIS_URL = "redis://:redispw0123456789@redis:6379/0"
COMPOSE_FALKORDB_URL = "redis://:falkorpw0123456789@falkordb:6379/0"
DSN = "postgresql://memento:pgpw0123456789@postgres:5432/memento"
CHART_DSN = "postgresql://memento:memento@postgres:5432/memento"
KUBE_VERSIONS = ("1.25.0", "1.33.0")  # the chart's oldest kubeVersion and the helm binary's generation


def need(getter: Any, *args: str) -> Any:
    """The tool, or a skip whose reason is printed past pytest's capture (a skip must not pass unseen)."""
    try:
        return getter(*args)
    except tools.ToolMissing as exc:
        print(f"\n*** SKIPPED, TOOL MISSING: {exc}", file=sys.__stderr__)
        pytest.skip(f"TOOL MISSING: {exc}")


def yaml_module() -> Any:
    return need(tools.python_module, "yaml")


# --- docker compose ----------------------------------------------------------------------------------------

def compose_config(*profiles: str, secret: str | None = SECRET, without: str = "",
                   variables: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`docker compose [--profile p] config` with only the variables the file reads set by the test (all of
    PASSWORDS, or `variables`, less `without`)."""
    command: list[str] = need(tools.compose)
    env = {k: v for k, v in os.environ.items() if k != "MEMENTO_AUTH_SECRET" and k not in PASSWORDS}
    env.update(PASSWORDS if variables is None else variables)
    env.pop(without, None)
    if secret is not None and variables is None:
        env["MEMENTO_AUTH_SECRET"] = secret
    flags = [arg for profile in profiles for arg in ("--profile", profile)]
    return subprocess.run([*command, "-f", str(ROOT / "docker-compose.yml"), *flags, "config"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def active_services(*profiles: str) -> dict[str, Any]:
    """The services `up` would start: compose v1's `config` lists every profile's, so filter as v2 does."""
    done = compose_config(*profiles)
    assert done.returncode == 0, done.stderr
    services: dict[str, Any] = yaml_module().safe_load(done.stdout)["services"]
    return {name: spec for name, spec in services.items()
            if not spec.get("profiles") or set(spec["profiles"]) & set(profiles)}


def environment(spec: dict[str, Any]) -> dict[str, str]:
    env = spec.get("environment", {})
    return dict(item.split("=", 1) for item in env) if isinstance(env, list) else dict(env)


def settings_from(env: dict[str, str]) -> Settings:
    """The daemon's own settings validation applied to a deployment's MEMENTO_* variables."""
    fields = {name.removeprefix("MEMENTO_").lower(): value for name, value in env.items()
              if name.startswith("MEMENTO_")}
    unknown = set(fields) - set(Settings.model_fields)
    assert not unknown, f"not daemon settings: {sorted(unknown)}"
    return load_settings(**fields)


def test_compose_default_runs_the_daemon_on_redis_falkordb_and_postgres() -> None:
    services = active_services()
    assert set(services) == {"memento", "redis", "falkordb", "postgres", "prometheus", "grafana"}
    daemon = services["memento"]
    env = environment(daemon)
    assert {k: env[k] for k in ("MEMENTO_HOST", "MEMENTO_REDIS_URL", "MEMENTO_POSTGRES_DSN", "MEMENTO_AUTH_SECRET")} \
        == {"MEMENTO_HOST": "0.0.0.0", "MEMENTO_REDIS_URL": COMPOSE_REDIS_URL,
            "MEMENTO_POSTGRES_DSN": DSN, "MEMENTO_AUTH_SECRET": SECRET}
    settings = settings_from(env)
    assert (settings.redis_url, settings.falkordb_url, settings.port) == (COMPOSE_REDIS_URL, COMPOSE_FALKORDB_URL, 8765)
    assert Path(daemon["build"]["context"]).resolve() == ROOT
    assert daemon["read_only"] is True
    assert {"/data", "/tmp"} <= set(daemon["tmpfs"])  # the only places a read-only daemon container writes
    assert {name: dep["condition"] for name, dep in daemon["depends_on"].items()} \
        == {"redis": "service_healthy", "falkordb": "service_healthy", "postgres": "service_healthy"}
    assert services["falkordb"]["image"].startswith("falkordb/falkordb:v4.")
    assert services["postgres"]["image"].startswith("postgres:16.")


def test_compose_healthcheck_is_the_images_own() -> None:
    daemon = active_services()["memento"]
    assert daemon["healthcheck"]["test"] == ["CMD", *dockerfile_healthcheck()]


def test_compose_publishes_ports_on_loopback_only() -> None:
    for name, spec in active_services("cluster").items():
        for port in spec.get("ports", []):
            published = port if isinstance(port, str) else f"{port.get('host_ip', '')}:{port['published']}"
            assert published.startswith("127.0.0.1:"), (name, port)


def test_compose_refuses_to_run_without_an_auth_secret() -> None:
    done = compose_config(secret=None)
    assert done.returncode != 0
    assert "set MEMENTO_AUTH_SECRET to a secret of 32 characters or more" in done.stderr


@pytest.mark.parametrize("name", sorted(PASSWORDS))
def test_compose_has_no_default_password(name: str) -> None:
    """Every backend password and Grafana's admin password must be given: none falls back to a known value."""
    done = compose_config(without=name)
    assert done.returncode != 0
    assert f"set {name}" in done.stderr and "deploy/compose-env.sh" in done.stderr


def test_compose_backends_ask_for_their_passwords() -> None:
    services = active_services("cluster")
    redis_command = services["redis"]["command"]
    assert redis_command[redis_command.index("--requirepass") + 1] == PASSWORDS["REDIS_PASSWORD"]
    falkordb_args = environment(services["falkordb"])["REDIS_ARGS"].split()
    assert falkordb_args[falkordb_args.index("--requirepass") + 1] == PASSWORDS["FALKORDB_PASSWORD"]
    for node in ("redis-node-1", "redis-node-2", "redis-node-3"):
        command = services[node]["command"]
        for flag in ("--requirepass", "--masterauth"):
            assert command[command.index(flag) + 1] == PASSWORDS["REDIS_PASSWORD"], (node, flag)
    for name in ("redis", "falkordb", "redis-node-1", "redis-cluster-init"):  # redis-cli (health, cluster create)
        expected = PASSWORDS["FALKORDB_PASSWORD" if name == "falkordb" else "REDIS_PASSWORD"]
        assert environment(services[name])["REDISCLI_AUTH"] == expected, name
    assert environment(services["postgres"])["POSTGRES_PASSWORD"] == PASSWORDS["POSTGRES_PASSWORD"]
    assert environment(services["grafana"])["GF_SECURITY_ADMIN_PASSWORD"] == PASSWORDS["GRAFANA_ADMIN_PASSWORD"]


# An exact release: major.minor.patch, or for Postgres (whose releases are major.minor) major.minor.
PINNED = re.compile(r"^(postgres:\d+\.\d+|[a-z0-9./_-]+:v?\d+\.\d+\.\d+)(-[a-z0-9.]+)?(@sha256:[0-9a-f]{64})?$")


def test_compose_and_dockerfile_images_are_pinned_to_exact_versions() -> None:
    images = {name: spec["image"] for name, spec in active_services("cluster").items() if "build" not in spec}
    assert len(images) == 9
    loose = {name: image for name, image in images.items() if not PINNED.match(image)}
    assert loose == {}
    bases = [line.split()[1] for line in dockerfile_lines() if line.startswith("FROM ")]
    assert len(bases) == 2 and all(PINNED.match(base) for base in bases), bases


def test_compose_env_generates_every_secret_once(tmp_path: Path) -> None:
    env_file = tmp_path / "compose.env"
    clean = {k: v for k, v in os.environ.items() if k != "MEMENTO_AUTH_SECRET" and k not in PASSWORDS}
    script = str(ROOT / "deploy" / "compose-env.sh")
    subprocess.run([script, str(env_file)], env=clean, check=True, capture_output=True, timeout=30)
    first = dict(line.split("=", 1) for line in env_file.read_text().splitlines())
    assert set(first) == {"MEMENTO_AUTH_SECRET", *PASSWORDS}
    assert all(re.fullmatch(r"[0-9a-f]{48}", value) for value in first.values()), first
    assert len(set(first.values())) == 5
    assert env_file.stat().st_mode & 0o777 == 0o600
    subprocess.run([script, str(env_file)], env=clean, check=True, capture_output=True, timeout=30)
    assert dict(line.split("=", 1) for line in env_file.read_text().splitlines()) == first  # kept
    done = compose_config(variables=first)
    assert done.returncode == 0, done.stderr


def test_compose_cluster_profile_runs_a_daemon_on_a_three_primary_cluster() -> None:
    services = active_services("cluster")
    assert set(services) == {"memento", "redis", "falkordb", "postgres", "prometheus", "grafana", "redis-node-1",
                             "redis-node-2", "redis-node-3", "redis-cluster-init", "memento-cluster"}
    env = environment(services["memento-cluster"])
    settings = settings_from(env)
    assert (settings.redis_url, settings.falkordb_url) == (CLUSTER_URL, COMPOSE_FALKORDB_URL)
    for node in ("redis-node-1", "redis-node-2", "redis-node-3"):
        command = services[node]["command"]
        assert command[command.index("--cluster-enabled") + 1] == "yes"
        assert command[command.index("--cluster-announce-hostname") + 1] == node
    assert services["redis-cluster-init"]["command"][-3:] == ["redis-node-1", "redis-node-2", "redis-node-3"]
    assert services["memento-cluster"]["depends_on"]["redis-cluster-init"]["condition"] \
        == "service_completed_successfully"


def test_compose_bind_mounts_name_files_in_the_repository() -> None:
    for name, spec in active_services("cluster").items():
        for volume in spec.get("volumes", []):
            source = volume.split(":")[0] if isinstance(volume, str) else volume["source"]
            if source.startswith(("/", ".")):
                assert (ROOT / source).resolve().exists(), (name, source)


def test_prometheus_scrapes_every_daemon_service() -> None:
    yaml = yaml_module()
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    [job] = config["scrape_configs"]
    [dns] = job["dns_sd_configs"]
    daemons = {name for name, spec in active_services("cluster").items() if "MEMENTO_REDIS_URL" in environment(spec)}
    assert (set(dns["names"]), dns["port"], job["metrics_path"]) == (daemons, 8765, "/metrics")


def test_grafana_provisioning_points_the_dashboard_at_the_provisioned_prometheus() -> None:
    yaml = yaml_module()
    grafana = ROOT / "deploy" / "grafana" / "provisioning"
    [source] = yaml.safe_load((grafana / "datasources" / "prometheus.yml").read_text())["datasources"]
    [provider] = yaml.safe_load((grafana / "dashboards" / "memento-sessions.yml").read_text())["providers"]
    mounts = [v.split(":")[1] for v in active_services()["grafana"]["volumes"] if isinstance(v, str)] or \
        [v["target"] for v in active_services()["grafana"]["volumes"]]
    assert provider["options"]["path"] in mounts
    assert source["url"] == "http://prometheus:9090"
    assert {target["datasource"]["uid"] for panel in panels() for target in panel["targets"]} == {source["uid"]}


# --- Dockerfile --------------------------------------------------------------------------------------------

def dockerfile_lines() -> list[str]:
    """Instructions with continuation lines joined."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def final_stage() -> list[str]:
    lines = dockerfile_lines()
    start = max(i for i, line in enumerate(lines) if line.startswith("FROM "))
    return lines[start:]


def dockerfile_healthcheck() -> list[str]:
    [line] = [line for line in final_stage() if line.startswith("HEALTHCHECK ")]
    command: list[str] = json.loads(line.split(" CMD ", 1)[1])
    return command


def test_dockerfile_runs_the_daemon_as_a_non_root_user_on_all_interfaces() -> None:
    stage = final_stage()
    assert stage[0].startswith("FROM python:3.11.") and stage[0].endswith("-slim")
    [user] = [line.split()[1] for line in stage if line.startswith("USER ")]
    assert user.split(":")[0] not in ("root", "0")
    env = " ".join(line for line in stage if line.startswith("ENV "))
    assert "MEMENTO_HOST=0.0.0.0" in env and "MEMENTO_PORT=8765" in env
    assert [line for line in stage if line.startswith("CMD ")] == ['CMD ["memento-sessions", "serve"]']
    assert "EXPOSE 8765" in stage
    command = dockerfile_healthcheck()
    assert command[0] == "python" and "/readyz" in command[-1]
    assert "curl" not in " ".join(stage)


def test_dockerignore_keeps_local_state_out_of_the_image() -> None:
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".git", ".venv", ".memento", ".env", "**/__pycache__"} <= ignored


class _Unready(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(503)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def unready_port() -> Iterator[int]:
    """An HTTP server whose /readyz answers 503, as a daemon whose backends are down."""
    server = HTTPServer(("127.0.0.1", 0), _Unready)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


async def run_healthcheck(port: int) -> int:
    command = dockerfile_healthcheck()
    command[0] = sys.executable
    done = await anyio.run_process(command, check=False, env={**os.environ, "MEMENTO_PORT": str(port)})
    return done.returncode


@pytest.mark.anyio
async def test_healthcheck_is_healthy_only_while_readyz_is_200(daemon: Daemon, unready_port: int) -> None:
    await wait_ready(daemon)
    assert await run_healthcheck(daemon.port) == 0
    assert await run_healthcheck(unready_port) == 1
    assert await run_healthcheck(free_port()) == 1


# --- Helm --------------------------------------------------------------------------------------------------

def helm(*args: str) -> subprocess.CompletedProcess[str]:
    binary: Path = need(tools.helm)
    return subprocess.run([str(binary), *args], cwd=CHART, capture_output=True, text=True, timeout=120, check=False)


def render(*args: str) -> dict[str, dict[str, Any]]:
    """`helm template` output by kind (one object of each kind here)."""
    done = helm("template", "memento", ".", "--namespace", "swarm", *args)
    assert done.returncode == 0, done.stderr
    objects = [doc for doc in yaml_module().safe_load_all(done.stdout) if doc]
    by_kind = {doc["kind"]: doc for doc in objects}
    assert len(by_kind) == len(objects)
    return by_kind


VALUES = {"default": (), "cluster": ("-f", str(CI_VALUES)), "gitops": ("-f", str(GITOPS_VALUES))}


@pytest.mark.parametrize("values", VALUES)
def test_helm_lint_passes(values: str) -> None:
    done = helm("lint", ".", "--strict", *VALUES[values])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout


@pytest.mark.parametrize("values", VALUES)
def test_helm_manifests_match_the_kubernetes_schemas(values: str) -> None:
    validator = need(tools.python_module, "kubernetes_validate")
    rendered = render(*VALUES[values])
    for obj in rendered.values():
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD: no schema offline; test_cluster_values_chart checks it against the Service
        for version in KUBE_VERSIONS:
            validator.validate(obj, version, strict=True)


def test_the_schema_check_rejects_a_misspelt_field() -> None:
    validator = need(tools.python_module, "kubernetes_validate")
    deployment = copy.deepcopy(render()["Deployment"])
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"httpGet": {"path": "/readyz"}}
    with pytest.raises(validator.ValidationError):
        validator.validate(deployment, KUBE_VERSIONS[-1], strict=True)


def pod_env(rendered: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Every MEMENTO_* variable a pod sees: the container's env plus the chart's Secret."""
    [container] = rendered["Deployment"]["spec"]["template"]["spec"]["containers"]
    return {**rendered["Secret"]["stringData"], **{item["name"]: item["value"] for item in container["env"]}}


def test_default_chart() -> None:
    rendered = render()
    assert set(rendered) == {"Deployment", "Service", "Secret", "PodDisruptionBudget", "ServiceAccount"}
    spec = rendered["Deployment"]["spec"]
    pod = spec["template"]["spec"]
    [container] = pod["containers"]
    assert spec["replicas"] == 2
    assert pod["terminationGracePeriodSeconds"] > 10
    assert (container["readinessProbe"]["httpGet"]["path"], container["livenessProbe"]["httpGet"]["path"]) \
        == ("/readyz", "/healthz")
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["resources"]["limits"] and container["resources"]["requests"]
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/data", "/tmp"}
    assert container["envFrom"] == [{"secretRef": {"name": rendered["Secret"]["metadata"]["name"]}}]
    settings = settings_from(pod_env(rendered))
    assert (settings.host, settings.redis_url, settings.falkordb_url, settings.postgres_dsn) \
        == ("0.0.0.0", "redis://redis:6379/0", "redis://falkordb:6379/0", CHART_DSN)  # FalkorDB apart
    assert len(settings.auth_secret or "") == 48  # generated at install
    selector = spec["selector"]["matchLabels"]
    assert rendered["PodDisruptionBudget"]["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": selector}}
    assert rendered["Service"]["spec"]["selector"] == selector
    assert rendered["Service"]["spec"]["ports"][0]["targetPort"] == container["ports"][0]["name"] == "http"


def test_cluster_values_chart() -> None:
    rendered = render("-f", str(CI_VALUES))
    assert "replicas" not in rendered["Deployment"]["spec"]  # the HPA owns the count
    hpa = rendered["HorizontalPodAutoscaler"]["spec"]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (3, 12)
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                     "name": rendered["Deployment"]["metadata"]["name"]}
    settings = settings_from(pod_env(rendered))
    assert settings.redis_url == ("redis+cluster://:cluster-password@redis-cluster-0.redis-cluster-headless:6379,"
                                  "redis-cluster-1.redis-cluster-headless:6379,redis-cluster-2.redis-cluster-headless:6379")
    assert settings.falkordb_url == "redis://falkordb:6379/0"
    assert "memento.example.com" in settings.extra_mcp_hosts
    assert "memento-memento-sessions.swarm.svc:8765" in settings.extra_mcp_hosts
    monitor = rendered["ServiceMonitor"]
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= rendered["Service"]["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == rendered["Service"]["spec"]["ports"][0]["name"]
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    dashboard = rendered["ConfigMap"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["memento-sessions.json"]) == json.loads(DASHBOARD.read_text())


@pytest.mark.parametrize(("args", "message"), [
    (("--set", "redis.cluster.enabled=true", "--set", "redis.cluster.nodes[0]=r:6379", "--set", "falkordb.url="),
     "redis.cluster.enabled needs falkordb.url"),
    (("--set", "ingress.enabled=true"), "ingress.enabled needs ingress.hosts"),
    (("--set", "redis.cluster.enabled=true", "--set", "falkordb.url=redis://f:6379"),
     "redis.cluster.enabled needs redis.cluster.nodes"),
    (("--set", "terminationGracePeriodSeconds=15"),
     "terminationGracePeriodSeconds (15) must exceed preStopSeconds (5) + 10"),
    (("--set", "auth.secret=short"), "auth.secret must be 32 characters or more"),
])
def test_helm_refuses_values_the_daemon_cannot_honour(args: tuple[str, ...], message: str) -> None:
    done = helm("template", "memento", ".", *args)
    assert done.returncode == 1
    assert message in done.stderr


GITOPS_MESSAGE = ("auth.requireSecret: set existingSecret or auth.secret. Without either the chart generates the "
                  "auth secret, and a `helm template` render (Argo CD, Flux) cannot look up the one it made before")


def test_helm_template_generates_a_new_secret_at_each_render_unless_one_is_given() -> None:
    """Why GitOps needs existingSecret or auth.secret: `helm template` cannot look up the Secret of the last render."""
    def auth_secret(*args: str) -> str:
        return str(render(*args)["Secret"]["stringData"]["MEMENTO_AUTH_SECRET"])

    assert auth_secret() != auth_secret()
    given = ("--set", f"auth.secret={SECRET}")
    assert auth_secret(*given) == auth_secret(*given) == SECRET


def test_require_secret_refuses_a_render_that_would_generate_one() -> None:
    done = helm("template", "memento", ".", "--set", "auth.requireSecret=true")
    assert done.returncode == 1
    assert GITOPS_MESSAGE in done.stderr
    for given in (("--set", "existingSecret=mine"), ("--set", f"auth.secret={SECRET}")):
        assert "Deployment" in render("--set", "auth.requireSecret=true", *given)
    notes = (CHART / "templates" / "NOTES.txt").read_text() + (CHART / "README.md").read_text()
    assert "helm template" in notes and "existingSecret" in notes and "auth.requireSecret" in notes


def test_gitops_values_chart_has_its_ingress_and_network_policy() -> None:
    rendered = render("-f", str(GITOPS_VALUES))
    assert set(rendered) == {"Deployment", "Service", "PodDisruptionBudget", "ServiceAccount", "Ingress",
                             "NetworkPolicy"}  # no Secret of the chart's: existingSecret
    service = rendered["Service"]
    [rule] = rendered["Ingress"]["spec"]["rules"]
    [path] = rule["http"]["paths"]
    assert rule["host"] == "memento.example.com"
    assert path["backend"]["service"] == {"name": service["metadata"]["name"], "port": {"name": "http"}}
    assert rendered["Ingress"]["spec"]["tls"] == [{"secretName": "memento-tls", "hosts": ["memento.example.com"]}]
    [container] = rendered["Deployment"]["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item["value"] for item in container["env"]}
    assert "memento.example.com" in env["MEMENTO_MCP_ALLOWED_HOSTS"].split(",")  # the Ingress's host reaches /mcp
    policy = rendered["NetworkPolicy"]["spec"]
    assert policy["podSelector"]["matchLabels"] == rendered["Deployment"]["spec"]["selector"]["matchLabels"]
    [allowed] = policy["ingress"]
    assert allowed["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert allowed["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "agents"}}}]
    assert {port["port"] for rule in policy["egress"] for port in rule["ports"]} == {53, 6379, 5432}


def test_existing_secret_replaces_the_charts_own() -> None:
    rendered = render("--set", "existingSecret=my-memento")
    assert "Secret" not in rendered
    [container] = rendered["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert container["envFrom"] == [{"secretRef": {"name": "my-memento"}}]


# --- Grafana dashboard -------------------------------------------------------------------------------------

METRIC = re.compile(r"\b((?:memento|process)_[a-z0-9_]+)\b")


def panels() -> list[dict[str, Any]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [panel for panel in dashboard["panels"] if panel["type"] != "row"]


def queried_metrics() -> set[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [target["expr"] for panel in panels() for target in panel["targets"]]
    exprs += [variable["definition"] for variable in dashboard["templating"]["list"]]
    return {name for expr in exprs for name in METRIC.findall(expr)}


async def wait_ready(daemon: Daemon) -> None:
    async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{daemon.port}") as http:
        with anyio.fail_after(10):
            while (await http.get("/readyz")).status_code != 200:
                await anyio.sleep(0.05)


async def exported(daemon: Daemon) -> tuple[set[str], set[str]]:
    """(every name a /metrics scrape can carry, the memento_* metric families) of a live daemon."""
    async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{daemon.port}") as http:
        text = (await http.get("/metrics")).text
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE))
    names = set(re.findall(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]", text, re.MULTILINE)) | set(types)
    names |= {f"{name}{suffix}" for name, kind in types.items() if kind == "histogram"
              for suffix in ("_bucket", "_sum", "_count")}
    families = {name for name, kind in types.items()
                if name.startswith("memento_") and not name.endswith("_created")}
    return names, families


def test_dashboard_panels_are_well_formed() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert dashboard["uid"] == "memento-sessions"
    for panel in panels():
        assert panel["targets"], panel["title"]
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]
        assert len({target["refId"] for target in panel["targets"]}) == len(panel["targets"])


@pytest.mark.anyio
async def test_dashboard_queries_only_metrics_the_daemon_exports(daemon: Daemon) -> None:
    names, _ = await exported(daemon)
    assert queried_metrics() - names == set()


@pytest.mark.anyio
async def test_every_metric_the_daemon_exports_has_a_panel(daemon: Daemon) -> None:
    _, families = await exported(daemon)
    queried = {re.sub(r"_(bucket|sum|count)$", "", name) for name in queried_metrics()}
    assert families - queried == set()


# --- pinned dependencies --------------------------------------------------------------------------------------

def test_the_suite_runs_on_the_pinned_versions_and_the_image_installs_them() -> None:
    pins = [line.split("==") for line in (ROOT / "constraints.txt").read_text().splitlines()
            if line and not line.startswith("#")]
    assert len(pins) > 50 and all(len(pin) == 2 for pin in pins)
    installed = {name: importlib.metadata.version(name) for name, _ in pins}
    assert installed == dict(pins)  # scripts/bootstrap installed exactly these
    assert "uvicorn" in installed and "redis" in installed
    install = 'pip install ".[server]" -c constraints.txt'  # the daemon's extra, at the pinned versions
    assert any(line.startswith("RUN ") and install in line for line in dockerfile_lines())
    assert "constraints.txt" in next(line for line in dockerfile_lines() if line.startswith("COPY pyproject.toml"))
