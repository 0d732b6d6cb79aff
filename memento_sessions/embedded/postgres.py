"""The embedded Postgres 16 from pgserver's binaries, run in the foreground as our child."""

from __future__ import annotations

import importlib.util
import os
import pwd
import signal
import stat
import subprocess
from pathlib import Path

from memento_sessions.embedded.process import ChildServer, EmbeddedStartError, as_user, kill_orphan

_SYSTEM_USER = "pgserver"  # postgres refuses to run as root


def _bin_dir() -> Path:
    # pgserver's own import has side effects (a runtime dir, atexit hooks); we only need its binaries.
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedStartError("the pgserver package is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def _open_path_for(path: Path) -> None:
    """Let another user traverse every parent of `path`."""
    for parent in [path, *path.parents]:
        mode = parent.stat().st_mode
        parent.chmod(mode | stat.S_IXOTH | stat.S_IROTH)


class EmbeddedPostgres(ChildServer):
    """Postgres on loopback TCP only, its cluster under `directory/pgdata`."""

    name = "postgres"
    stop_signal = signal.SIGINT  # "fast" shutdown: roll back clients, checkpoint, exit

    def __init__(self, directory: Path, port: int = 0) -> None:
        super().__init__(directory, port)
        self.bin = _bin_dir()
        self.pgdata = directory / "pgdata"

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def run_as(self) -> str | None:
        if os.geteuid() != 0:
            return None
        try:
            pwd.getpwnam(_SYSTEM_USER)
        except KeyError:
            subprocess.run(["useradd", "--system", "--no-create-home", _SYSTEM_USER], check=True)
        return _SYSTEM_USER

    def prepare(self) -> None:
        user = self.run_as()
        if user is not None:
            self._grant(user)
        if not (self.pgdata / "PG_VERSION").exists():
            self._initdb(user)
        kill_orphan(self.pgdata / "postmaster.pid", str(self.bin / "postgres"))
        (self.pgdata / "postmaster.pid").unlink(missing_ok=True)

    def _grant(self, user: str) -> None:
        entry = pwd.getpwnam(user)
        self.pgdata.mkdir(parents=True, exist_ok=True)
        os.chown(self.pgdata, entry.pw_uid, entry.pw_gid)
        self.pgdata.chmod(0o700)
        os.chown(self.directory, entry.pw_uid, entry.pw_gid)
        _open_path_for(self.directory)
        _open_path_for(self.bin / "postgres")
        for sub in ("lib", "share"):
            if (self.bin.parent / sub).exists():
                _open_path_for(self.bin.parent / sub)

    def _initdb(self, user: str | None) -> None:
        args = [str(self.bin / "initdb"), "-D", str(self.pgdata), "--auth=trust", "-U", "postgres",
                "-E", "utf8", "--no-sync"]
        with open(self.log_path, "ab") as out:
            done = subprocess.run(args, stdout=out, stderr=subprocess.STDOUT, check=False,
                                  **as_user(user))
        if done.returncode != 0:
            raise EmbeddedStartError(f"initdb failed with {done.returncode}; see {self.log_path}")

    def argv(self) -> list[str]:
        return [
            str(self.bin / "postgres"), "-D", str(self.pgdata), "-h", "127.0.0.1", "-p", str(self.port),
            "-c", "unix_socket_directories=", "-c", "max_connections=200", "-c", "fsync=on",
        ]

    def ping(self) -> bool:
        """Our postmaster says it is ready, on our port (postmaster.pid: pid, ..., port, ..., status)."""
        if self.proc is None:
            return False
        try:
            lines = (self.pgdata / "postmaster.pid").read_text().splitlines()
        except OSError:
            return False
        return (len(lines) >= 8 and lines[0].strip() == str(self.proc.pid) and lines[3].strip() == str(self.port)
                and lines[7].strip() == "ready")
