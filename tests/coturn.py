"""A real TURN server for the tests: Debian's coturn (`turnserver`) on 127.0.0.1, relaying only on loopback."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

REALM = "realtime.test"


@dataclass
class Coturn:
    port: int
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def url(self) -> str:
        return f"turn:127.0.0.1:{self.port}"

    def allocations(self) -> int:
        """Relays allocated so far (coturn logs one 'ALLOCATE processed, success' per allocation)."""
        return self.log.read_text(errors="replace").count("ALLOCATE processed, success")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_coturn(tmp: Path, *, user: tuple[str, str] | None = None, secret: str | None = None) -> Coturn:
    """Start turnserver with a long-term user (`user`) or a TURN REST API secret (`secret`); wait until it listens."""
    binary = shutil.which("turnserver")
    assert binary, "turnserver is required (apt-get install coturn; tests/run.sh does it)"
    port = _free_udp_port()
    relay_lo = 20000 + (port % 200) * 100  # a relay port range of its own per instance
    log = tmp / f"coturn-{port}.log"
    args = [binary, "-n", "--no-cli", "--listening-ip=127.0.0.1", "--relay-ip=127.0.0.1",
            f"--listening-port={port}", f"--min-port={relay_lo}", f"--max-port={relay_lo + 99}",
            "--allow-loopback-peers", "--no-tls", "--no-dtls", "--fingerprint", f"--realm={REALM}",
            f"--userdb={tmp / f'turndb-{port}'}", f"--pidfile={tmp / f'coturn-{port}.pid'}",
            "--log-file=stdout", "--simple-log", "--verbose"]
    if secret is not None:
        args += ["--use-auth-secret", f"--static-auth-secret={secret}"]
    else:
        name, password = user or ("realtime", "relay-pass")
        args += ["--lt-cred-mech", f"--user={name}:{password}"]
    proc = subprocess.Popen(args, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60  # reached only when turnserver cannot start
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"turnserver exited with {proc.returncode}:\n{log.read_text()[-2000:]}")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            # a STUN binding request; coturn answers once its UDP listener is up
            probe.settimeout(0.2)
            probe.sendto(bytes.fromhex("000100002112a442") + bytes(12), ("127.0.0.1", port))
            try:
                probe.recvfrom(512)
                return Coturn(port, proc, log)
            except OSError:
                pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"turnserver did not answer on {port}:\n{log.read_text()[-2000:]}")
