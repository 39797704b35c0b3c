"""A real PostgreSQL server for the tests: Debian's binaries, a cluster made in a temporary folder, listening on
loopback only, stopped at the end. As root (CI), it runs as the `postgres` user (PostgreSQL refuses root)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import time
from pathlib import Path

from conftest import free_port


def binaries() -> Path | None:
    """The folder of PostgreSQL's server programs, or None where it is not installed."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).resolve().parent if initdb else None


class Postgres:
    def __init__(self, folder: Path) -> None:
        bin_dir = binaries()
        if bin_dir is None:
            raise RuntimeError("PostgreSQL is not installed (apt-get install postgresql)")
        self.bin = bin_dir
        self.folder = folder
        self.data = folder / "cluster"
        self.port = free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        folder.mkdir(parents=True, exist_ok=True)
        if self._as:
            shutil.chown(folder, "postgres")
            for parent in folder.parents:  # the postgres user must reach its folder
                if parent == Path("/") or parent == Path("/tmp"):
                    break
                parent.chmod(parent.stat().st_mode | 0o011)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        self.start()

    def _run(self, program: str, *args: str) -> None:
        subprocess.run([*self._as, str(self.bin / program), *args], check=True, capture_output=True,
                       cwd=self.folder)

    def start(self) -> None:
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.folder} -c fsync=off"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.folder / "server.log"), "-o", options, "-w",
                  "start")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def close(self) -> None:
        try:
            self.stop("immediate")
        except subprocess.CalledProcessError:
            pass


def wait_for(check: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(check) and check():
            return
        time.sleep(0.05)
    raise AssertionError("timed out")
