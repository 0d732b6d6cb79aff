"""The embedded Postgres 16 from pgserver's binaries, run in the foreground as our child.

It asks for a password (scram-sha-256) on every connection; the password is generated into
`directory/password` (0600) and reaches initdb on its stdin, never on a command line.

As root, Postgres (which refuses root) runs as the system user `pgserver`. That user owns the
cluster directory but may not be able to reach it: a data dir under /root, or under pytest's 0700
temp dir, has parents only root can traverse. Rather than opening those parents to every local user,
the child is started in the cluster directory (the chdir happens while it is still root) and given
`/proc/self/cwd` as its data directory: that link leads to the directory without walking its parents,
and every process Postgres forks inherits the same working directory.

Its binaries need the same care: pgserver's install sits in the virtualenv, which may be in a 0700 home
too (root's /root/app in a container). As root, when some directory above that install is closed to
other users, the install is copied once, root-owned and world-readable, to
/var/lib/memento-sessions/pgserver-<version> (written under a temporary name, then renamed) and run from there.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import signal
import stat
import subprocess
import tempfile
from functools import cached_property
from importlib import metadata
from pathlib import Path

from memento_sessions.embedded.datadir import server_password
from memento_sessions.embedded.process import CHILD_UMASK, ChildServer, as_user, kill_orphan
from memento_sessions.errors import EmbeddedStartError

_SYSTEM_USER = "pgserver"  # postgres refuses to run as root
_HERE = "/proc/self/cwd"
SHARED_INSTALLS = Path("/var/lib/memento-sessions")  # root's copies of pgserver's install, by version
SUPERUSER = "postgres"
HBA = """# Written by memento-sessions at every start: loopback TCP only, always with a password.
host all all 127.0.0.1/32 scram-sha-256
host all all ::1/128 scram-sha-256
"""


def _bin_dir() -> Path:
    # pgserver's own import has side effects (a runtime dir, atexit hooks); we only need its binaries.
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedStartError("the pgserver package is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def _open_to_others(path: Path) -> bool:
    """Every directory from / down to `path` lets any user through (o+x)."""
    return all(parent.stat().st_mode & stat.S_IXOTH for parent in (path, *path.parents))


def reachable_bin_dir(bin_dir: Path) -> Path:
    """`bin_dir`, or as root when another user cannot reach it, the bin of a shared copy of its install."""
    install = bin_dir.resolve().parent
    if os.geteuid() != 0 or _open_to_others(install):
        return bin_dir
    try:
        version = metadata.version("pgserver")
    except metadata.PackageNotFoundError:
        version = "unknown"
    shared = SHARED_INSTALLS / f"pgserver-{version}"
    shared_bin = shared / "pgserver" / install.name / "bin"
    if not (shared_bin / "postgres").is_file():
        try:
            _copy_install(install, shared)
        except OSError as exc:
            raise EmbeddedStartError(
                f"as root, Postgres runs as the system user {_SYSTEM_USER!r}, which cannot reach {install}; "
                f"copying it to {shared} failed ({exc}): make {SHARED_INSTALLS} writable, install "
                "memento-sessions where other users can read it, or set MEMENTO_POSTGRES_DSN") from None
    return shared_bin


def _copy_install(install: Path, shared: Path) -> None:
    """pginstall and the libraries its binaries find beside the package (rpath $ORIGIN/../../../pgserver.libs),
    in the same layout; copied under a temporary name, then renamed: a half copy is never found as ready."""
    shared.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    partial = Path(tempfile.mkdtemp(prefix=f".{shared.name}.", dir=shared.parent))
    try:
        shutil.copytree(install, partial / "pgserver" / install.name, symlinks=True)
        libs = install.parent.parent / "pgserver.libs"
        if libs.is_dir():
            shutil.copytree(libs, partial / libs.name, symlinks=True)
        for directory, _, _ in os.walk(partial):
            os.chmod(directory, 0o755)
        try:
            partial.rename(shared)
        except OSError:
            if not shared.is_dir():  # else another start finished its copy first
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)


class EmbeddedPostgres(ChildServer):
    """Postgres on loopback TCP only, its cluster under `directory/pgdata`, behind a password."""

    name = "postgres"
    stop_signal = signal.SIGINT  # "fast" shutdown: roll back clients, checkpoint, exit

    def __init__(self, directory: Path, port: int = 0) -> None:
        super().__init__(directory, port)
        self.bin = reachable_bin_dir(_bin_dir())
        self.pgdata = directory / "pgdata"

    @cached_property
    def password(self) -> str:
        """The superuser's password, generated on first use, then read from the data dir."""
        return server_password(self.directory)

    @property
    def url(self) -> str:
        return f"postgresql://{SUPERUSER}:{self.password}@127.0.0.1:{self.port}/postgres"

    def run_as(self) -> str | None:
        if os.geteuid() != 0:
            return None
        try:
            pwd.getpwnam(_SYSTEM_USER)
        except KeyError:
            subprocess.run(["useradd", "--system", "--no-create-home", _SYSTEM_USER], check=True)
        return _SYSTEM_USER

    def cwd(self) -> Path | None:
        return self.pgdata if self.run_as() else None

    @property
    def data_arg(self) -> str:
        """The data directory as the child sees it (see the module's docstring)."""
        return _HERE if self.run_as() else str(self.pgdata)

    def prepare(self) -> None:
        user = self.run_as()
        if self.directory.stat().st_uid != os.geteuid():
            # an older version gave this directory to `pgserver`: the password file in it is ours alone
            os.chown(self.directory, os.geteuid(), os.getegid())
        self._own_pgdata(user)
        kill_orphan(self.pgdata / "postmaster.pid", str(self.bin / "postgres"))
        (self.pgdata / "postmaster.pid").unlink(missing_ok=True)
        if not (self.pgdata / "PG_VERSION").exists():
            self._initdb(user)
        elif not self._hba_is_ours():
            self._set_password(user)  # a cluster made by an older version, with trust authentication
        self._write_hba()

    def _own_pgdata(self, user: str | None) -> None:
        """pgdata, 0700, owned by the user Postgres runs as; nothing outside it changes."""
        self.pgdata.mkdir(exist_ok=True, mode=0o700)
        self.pgdata.chmod(0o700)
        if user is None:
            return
        entry = pwd.getpwnam(user)
        os.chown(self.pgdata, entry.pw_uid, entry.pw_gid)
        self._run([str(self.bin / "postgres"), "--version"], user, "the postgres binary",
                  hint=f"as root, Postgres runs as the system user {user!r}, which must be able to read "
                  f"{self.bin.parent} (or set MEMENTO_POSTGRES_DSN to use your own Postgres)")

    def _initdb(self, user: str | None) -> None:
        args = [str(self.bin / "initdb"), "-D", self.data_arg, "--auth=scram-sha-256", "-U", SUPERUSER,
                "--pwprompt", "-E", "utf8", "--no-sync"]
        # --pwprompt reads stdin when there is no terminal (the child has its own session)
        self._run(args, user, "initdb", stdin=f"{self.password}\n{self.password}\n")

    def _set_password(self, user: str | None) -> None:
        args = [str(self.bin / "postgres"), "--single", "-D", self.data_arg, "postgres"]
        self._run(args, user, "setting the postgres password",
                  stdin=f"ALTER ROLE {SUPERUSER} PASSWORD '{self.password}';\n")

    def _hba_is_ours(self) -> bool:
        try:
            return (self.pgdata / "pg_hba.conf").read_text() == HBA
        except OSError:
            return False

    def _write_hba(self) -> None:
        path = self.pgdata / "pg_hba.conf"
        if self._hba_is_ours():
            return
        path.write_text(HBA)
        path.chmod(0o600)
        stat = self.pgdata.stat()
        os.chown(path, stat.st_uid, stat.st_gid)

    def _run(self, args: list[str], user: str | None, what: str, stdin: str = "", hint: str = "") -> None:
        """Run one of Postgres's tools to completion as `user`, its output into our log."""
        hint = hint or f"see {self.log_path}"
        with self.open_log() as out:
            try:
                done = subprocess.run(args, input=stdin.encode(), stdout=out, stderr=subprocess.STDOUT, check=False,
                                      cwd=self.cwd(), umask=CHILD_UMASK, start_new_session=True, **as_user(user))
            except OSError as exc:  # the binary could not be executed at all (as `user`)
                raise EmbeddedStartError(f"{what} could not run: {exc}; {hint}") from None
        if done.returncode != 0:
            raise EmbeddedStartError(f"{what} failed with {done.returncode}; {hint}")

    def argv(self) -> list[str]:
        return [
            str(self.bin / "postgres"), "-D", self.data_arg, "-h", "127.0.0.1", "-p", str(self.port),
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
