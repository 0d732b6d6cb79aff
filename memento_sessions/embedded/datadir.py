"""The data directory: one daemon at a time (an flock), and the secrets generated into it.

Everything under the data directory is for its owner only: the directories are 0700 and the
secrets 0600, so other local users can read neither the data nor the passwords of the servers.
"""

from __future__ import annotations

import fcntl
import os
import secrets
from collections.abc import Callable
from pathlib import Path

from memento_sessions.errors import ConfigError
from memento_sessions.errors import DataDirLocked as DataDirLocked  # defined in errors; name kept for importers

AUTH_SECRET_FILE = "auth_secret"


class DataDirLock:
    """Exclusive, non-blocking lock on `<data dir>/daemon.lock`; released when the process dies."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / "daemon.lock"
        self._fd: int | None = None

    def __enter__(self) -> DataDirLock:
        private_dir(self.path.parent)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise DataDirLocked(
                f"data dir {self.path.parent} is in use by another memento-sessions daemon (pid {holder})"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the lock; safe to call twice."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def private_dir(path: Path) -> Path:
    """Create `path` (and missing parents) and make it owner-only; its existing parents are left alone."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.stat().st_mode & 0o077:
        path.chmod(0o700)  # made by an older version, or by hand: still ours to lock down
    return path


def secret_file(path: Path, make: Callable[[], str]) -> str:
    """The secret kept in `path` (0600), generated with `make()` on first use."""
    private_dir(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return read_secret(path) or ""
    with os.fdopen(fd, "w") as out:
        out.write(make())
    return read_secret(path) or ""


def read_secret(path: Path) -> str | None:
    """The secret in `path`, None when there is none; the file is made 0600 if it was not."""
    try:
        if path.stat().st_mode & 0o077:
            path.chmod(0o600)
        return path.read_text().strip() or None
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None


def auth_secret(data_dir: Path) -> str:
    """The token-signing secret kept in the data dir, generated on first use (by the daemon)."""
    return secret_file(data_dir / AUTH_SECRET_FILE, lambda: secrets.token_urlsafe(48))


def existing_auth_secret(data_dir: Path) -> str | None:
    """The data dir's token-signing secret, None when no daemon ever ran there (nothing is created)."""
    return read_secret(data_dir / AUTH_SECRET_FILE)


def server_password(directory: Path) -> str:
    """An embedded server's password, kept in `directory/password`; hex, so it needs no quoting in a URL."""
    return secret_file(directory / "password", lambda: secrets.token_hex(24))
