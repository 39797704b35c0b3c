"""Apps launched with the flags that the tests of live protocols, faults and limits are about, each shared by the
tests that need those flags (a pytest plugin: test modules name it in `pytest_plugins`).

Each fixture is session-scoped, so an app starts once per worker process; the tests that share one are in one
xdist group (named after the module that uses it most), which puts them on one worker. Every test leaves the app
as it found it (sessions closed, slots freed); counters that tests read (/health's reclaimed sessions and refusals)
are compared before and after.

- `keyed_app`: `--api-key`, `--concurrency-limit 3` and `--keep-audio` (group test_realtime_api): the Realtime
  API's tests, the page's concurrency limit, transcripts that need the key, a kept session transcribed again.
- `limited_app`: `--max-new-connections-per-minute 2 --max-connections-per-client 5 --session-time-limit 2
  --no-history` (group test_signalling): the page's per-client caps (offers that never connect, so no session the
  time limit could end), the time limit ending a Realtime API session, and an app that keeps no history.
- `remote_app`: `--engine remote` on a misbehaving endpoint (tests/endpoints.py) with short timeouts (group
  test_faults): the remote faults of live sessions, API requests and Realtime API items.

PYTEST_DONT_REWRITE: test modules import its constants before pytest loads it as a plugin (it has no assertions).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from endpoints import FakeEndpoint

from conftest import App, launch, stop

KEY = "realtime-test-key"
LIMIT = 3
"""The keyed app's --concurrency-limit."""
PER_MINUTE = 2
"""The limited app's --max-new-connections-per-minute (per client address)."""
TIME_LIMIT_S = 2


@pytest.fixture(scope="session")
def keyed_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[App]:
    a = launch(tmp_path_factory.mktemp("keyed-app"), "--api-key", KEY, "--concurrency-limit", str(LIMIT),
               "--keep-audio")
    yield a
    stop(a)


@pytest.fixture(scope="session")
def limited_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[App]:
    a = launch(tmp_path_factory.mktemp("limited-app"), "--max-new-connections-per-minute", str(PER_MINUTE),
               "--max-connections-per-client", "5", "--session-time-limit", str(TIME_LIMIT_S), "--no-history")
    yield a
    stop(a)


@pytest.fixture(scope="session")
def remote_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[App, FakeEndpoint]]:
    """The app with `--engine remote` on a fake endpoint: a read timeout of 1 s plus the clip's duration, one retry,
    and one partial per segment (a long interval), so that what meets a fault is the segment's final."""
    endpoint = FakeEndpoint()
    app = launch(tmp_path_factory.mktemp("remote-app"), "--engine", "remote", "--remote-url",
                 f"{endpoint.url}/v1/audio/transcriptions", "--remote-timeout", "1", "--remote-connect-timeout", "1",
                 "--remote-retries", "1", "--partial-interval", "60", "--partial-interval-max", "60")
    yield app, endpoint
    stop(app)
    endpoint.close()
