"""The data directory: one daemon at a time (an flock), and the generated auth secret."""

from __future__ import annotations

import fcntl
import os
import secrets
from pathlib import Path

from memento_sessions.errors import MementoError


class DataDirLocked(MementoError):
    """Another daemon already uses this data directory."""


class DataDirLock:
    """Exclusive, non-blocking lock on `<data dir>/daemon.lock`; released when the process dies."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / "daemon.lock"
        self._fd: int | None = None

    def __enter__(self) -> DataDirLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
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


def auth_secret(data_dir: Path) -> str:
    """The secret kept in the data dir, generated on first use."""
    path = data_dir / "auth_secret"
    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_urlsafe(48))
    return path.read_text().strip()


