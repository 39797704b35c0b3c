"""Giving freed memory back to the system once the transcription queue empties.

glibc's malloc keeps what a thread freed in that thread's heap (arena) for its next allocation instead of
returning it, so an engine batch larger than any before it raises the process's RSS for good: a server's
memory climbs in steps with load and does not come down when the load does. `IdleTrim` asks glibc
(`malloc_trim`) to return every arena's free pages when the worker's queue empties: at most once per
`min_interval_s`, the last idle moment of a busy spell always included, in a thread so that the event loop
does not wait. Where the C library has no `malloc_trim` (musl, macOS) it does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import time
from collections.abc import Callable


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim = ctypes.CDLL(None).malloc_trim  # the C library this process runs on
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


malloc_trim = _malloc_trim()
"""glibc's `malloc_trim(pad)`, or None where the C library lacks it."""


MIN_INTERVAL_S = 2.0
"""The least time between two trims: a busy spell's trailing trim comes at most this long after it ends."""


class IdleTrim:
    """The worker's idle hook: schedules a `malloc_trim` on the running loop, throttled with a trailing edge."""

    def __init__(self, min_interval_s: float = MIN_INTERVAL_S) -> None:
        self.min_interval_s = min_interval_s
        self.trims = 0
        self.last: asyncio.Future[int] | None = None
        """The last trim, running or done in its thread: what a caller awaits to know the memory has gone back."""
        self._last = float("-inf")
        self._pending: asyncio.TimerHandle | None = None

    def __call__(self) -> None:
        if malloc_trim is None or self._pending is not None:
            return
        loop = asyncio.get_running_loop()
        delay = max(0.0, self._last + self.min_interval_s - time.monotonic())
        self._pending = loop.call_later(delay, self._run, loop)

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        self._pending = None
        self._last = time.monotonic()
        self.trims += 1
        self.last = loop.run_in_executor(None, malloc_trim, 0)

    def cancel(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
