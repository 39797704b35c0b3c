"""Which app instances are still running, so that a restarted app can tell its dead predecessors' sessions
(interrupted) from those that other running instances hold (still live).

Each instance holds a lock for as long as its process lives, and the operating system or the database server drops
it when the process dies, `kill -9` included: a file lock (`flock`) beside a SQLite database, a session-level
advisory lock on PostgreSQL. An instance whose lock can be taken is gone.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from pathlib import Path
from typing import Protocol

import sqlalchemy as sa


class Liveness(Protocol):
    def hold(self, instance: str) -> None:
        """Take this instance's lock for the life of the process."""

    def gone(self, instance: str) -> bool:
        """Whether no running process holds `instance`'s lock."""

    def release(self) -> None:
        """Let go of this instance's lock (a clean stop)."""

    def renew(self) -> None:
        """Hold the lock again if the database lost it (its server restarted)."""


class FileLocks:
    """Lock files in a folder beside the SQLite database."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._held: int | None = None
        self._mine: Path | None = None

    def _path(self, instance: str) -> Path:
        return self.folder / f"{instance}.lock"

    def hold(self, instance: str) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self._mine = self._path(instance)
        self._held = os.open(self._mine, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._held, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def gone(self, instance: str) -> bool:
        path = self._path(instance)
        if path == self._mine:
            return False
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        finally:
            os.close(fd)
        path.unlink(missing_ok=True)
        return True

    def renew(self) -> None:
        pass

    def release(self) -> None:
        if self._held is not None:
            os.close(self._held)
            self._held = None
        if self._mine is not None:
            self._mine.unlink(missing_ok=True)


def _key(instance: str) -> int:
    return int.from_bytes(hashlib.sha256(instance.encode()).digest()[:8], "big", signed=True)


class AdvisoryLocks:
    """PostgreSQL advisory locks, held on a connection of their own."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        self._connection: sa.Connection | None = None
        self._instance: str | None = None

    def hold(self, instance: str) -> None:
        self._instance = instance
        self._connection = self.engine.connect()
        self._connection.detach()  # out of the pool: closing it ends the database session and its lock
        self._connection.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": _key(instance)})
        self._connection.commit()

    def gone(self, instance: str) -> bool:
        with self.engine.connect() as c:
            taken = c.execute(sa.text("SELECT pg_try_advisory_lock(:k)"), {"k": _key(instance)}).scalar()
            if taken:
                c.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": _key(instance)})
            c.commit()
        return bool(taken)

    def renew(self) -> None:
        if self._connection is None or self._instance is None:
            return
        try:
            self._connection.execute(sa.text("SELECT 1"))
            self._connection.commit()
        except sa.exc.SQLAlchemyError:  # the server went away and came back: a new database session, a new lock
            try:
                self._connection.close()
            except sa.exc.SQLAlchemyError:
                pass
            self.hold(self._instance)

    def release(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


class NoLocks:
    """An in-memory database: no other process shares it."""

    def hold(self, instance: str) -> None:
        pass

    def gone(self, instance: str) -> bool:
        return False

    def renew(self) -> None:
        pass

    def release(self) -> None:
        pass
