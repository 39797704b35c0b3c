"""The queue and worker with the real embedded engine: order, shedding, overload, disconnects."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from realtime.audio import decode_file
from realtime.engines import EngineError, TranscribeOptions
from realtime.live.memory import malloc_trim
from realtime.live.worker import Job, Overloaded, Worker

from real_speech import clips as real_clips
from speech import SENTENCES, sentence_audio, wer


@pytest.fixture(scope="module")
def clips(speech_dir):
    cache = speech_dir / ".speech-cache"
    cache.mkdir(exist_ok=True)
    return [sentence_audio(t, cache) for t in SENTENCES[:4]]


def test_finals_keep_session_order_and_survive_while_partials_are_shed(engine, clips):
    async def scenario():
        worker = Worker(engine, batch_size=2)
        worker.start()
        done: dict[str, list[int]] = {"a": [], "b": []}
        finals = []
        partials = []
        for i in range(4):
            for session in ("a", "b"):
                # a burst of partials per session: only the newest pending one may run
                for k in range(5):
                    partials.append(worker.submit(Job(session, i, clips[i][: 8000 * (k + 1)], "partial",
                                                      TranscribeOptions(partial=True))))
                job = Job(session, i, clips[i], "final")
                fut = worker.submit(job)
                fut.add_done_callback(lambda f, s=session, n=i: done[s].append(n))
                finals.append((session, i, fut))
        results = [await f for _, _, f in finals]
        await asyncio.gather(*partials, return_exceptions=True)  # the newest partials run before the worker stops
        await worker.stop()
        return worker, done, finals, results, partials

    worker, done, finals, results, partials = asyncio.run(scenario())
    assert done == {"a": [0, 1, 2, 3], "b": [0, 1, 2, 3]}
    for (_, i, _), result in zip(finals, results, strict=True):
        assert wer(SENTENCES[i], result.text) <= 0.3
    shed = sum(1 for p in partials if p.cancelled())
    assert shed >= len(partials) - 2 * 4, "stale partials must be coalesced away"
    assert worker.stats.partials_shed >= shed - 2
    assert worker.stats.finals == 8


def test_overload_gives_explicit_error_not_silent_loss(engine, clips):
    async def scenario():
        worker = Worker(engine, max_pending_audio_s=3.0)  # room for about one sentence
        futures = [worker.submit(Job("s", i, clips[i], "final")) for i in range(3)]
        worker.start()
        out = await asyncio.gather(*futures, return_exceptions=True)
        await worker.stop()
        return out

    out = asyncio.run(scenario())
    assert not isinstance(out[0], BaseException)
    assert any(isinstance(r, Overloaded) for r in out[1:])
    assert all(isinstance(r, (Overloaded, type(out[0]))) for r in out)


def test_disconnect_cancels_and_frees_session_jobs(engine, clips):
    async def scenario():
        worker = Worker(engine)
        keep = worker.submit(Job("stay", 0, clips[0], "final"))
        gone = [worker.submit(Job("gone", i, clips[i], "final")) for i in range(3)]
        gone.append(worker.submit(Job("gone", 3, clips[3], "partial", TranscribeOptions(partial=True))))
        worker.cancel_session("gone")
        pending_after_cancel = (worker.pending_finals, worker._pending_samples, worker.has_partial("gone"))
        worker.start()
        result = await keep
        await worker.stop()
        return gone, result, pending_after_cancel

    gone, result, pending = asyncio.run(scenario())
    assert all(f.cancelled() for f in gone)
    assert pending == (1, clips[0].size, False)
    assert wer(SENTENCES[0], result.text) <= 0.3


def test_engine_error_reaches_the_job_and_the_worker_goes_on(engine, clips):
    async def scenario():
        worker = Worker(engine)
        worker.start()
        bad = worker.submit(Job("s", 0, np.ones((2, 2, 2), dtype=np.float32), "final"))
        good = worker.submit(Job("s", 1, clips[1], "final"))
        out = await asyncio.gather(bad, good, return_exceptions=True)
        await worker.stop()
        return out

    bad, good = asyncio.run(scenario())
    assert isinstance(bad, EngineError)
    assert wer(SENTENCES[1], good.text) <= 0.3


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


@pytest.mark.skipif(malloc_trim is None, reason="malloc_trim is glibc's; this C library keeps no such heaps")
def test_memory_freed_by_a_busy_spell_goes_back_to_the_system_once_the_queue_empties(engine):
    """Batches of real speech through the service's worker, then idle: what glibc kept of the batches' memory has
    been returned (a malloc_trim of our own afterwards finds next to nothing left), each busy spell trimmed once.
    A spell's jobs are queued at once, so the queue empties once per spell, and the memory is measured once that
    spell's trim has run."""
    from realtime.config import Settings
    from realtime.live.service import TranscriptionService

    audio = [decode_file(c.path) for c in real_clips({"short", "read"}, longest=12.0)[:16]]

    async def scenario() -> tuple[float, float, int]:
        service = TranscriptionService(Settings(), engine=engine)
        service.idle_trim.min_interval_s = 0.5
        await service.start()
        worker = service.file_worker()
        for spell in (1, 2):
            await asyncio.gather(*(worker.submit(Job("file", i, a, "file")) for i, a in enumerate(audio)))
            deadline = time.monotonic() + 60
            while service.idle_trim.trims < spell:  # the queue emptied: its trim comes within min_interval_s
                assert time.monotonic() < deadline, "no trim after a busy spell"
                await asyncio.sleep(0.01)
            assert service.idle_trim.last is not None
            await service.idle_trim.last
        kept = _rss_mb()
        malloc_trim(0)
        left = kept - _rss_mb()
        trims = service.idle_trim.trims
        await worker.stop()  # not service.stop(): the engine is the shared one
        service.idle_trim.cancel()
        return kept, left, trims

    kept, left, trims = asyncio.run(scenario())
    print(f"RSS after the worker went idle {kept:.0f} MB; a further malloc_trim released {left:.1f} MB; {trims} trims")
    assert trims == 2, "one trim per busy spell"
    assert left < 10, f"{left:.0f} MB of freed memory was still held by the C library after the queue emptied"


@pytest.mark.fast
def test_idle_trims_are_throttled_with_a_trailing_edge():
    """The idle hook trims at once after a quiet while; called again within min_interval_s it schedules one trim
    for when the interval is over (however often it is called meanwhile), so a busy spell's last idle moment is
    always trimmed and the trims never come closer than the interval."""
    from realtime.live.memory import IdleTrim

    async def scenario() -> tuple[int, int, float]:
        trim = IdleTrim(min_interval_s=0.2)
        trim()  # on the loop's next turn
        while trim.trims < 1:
            await asyncio.sleep(0.01)
        first = trim.last
        assert first is not None
        await first
        first_at = trim._last
        for _ in range(5):
            trim()  # a busy spell's idle moments: one trailing trim
        at_once = trim.trims
        while trim.trims < 2:
            await asyncio.sleep(0.01)
        assert trim.last is not None and trim.last is not first
        await trim.last
        return at_once, trim.trims, trim._last - first_at

    at_once, trims, apart = asyncio.run(scenario())
    assert (at_once, trims) == (1, 2)
    assert apart >= 0.2 - 1e-3, "the trailing trim waits out the interval"


def test_the_idle_hook_runs_each_time_the_queue_empties(engine):
    async def scenario() -> list[int]:
        worker = Worker(engine, batch_size=2)
        idle: list[int] = []
        emptied = asyncio.Event()

        def on_idle() -> None:
            idle.append(worker.stats.finals)
            emptied.set()

        worker.on_idle = on_idle
        worker.start()
        silence = np.zeros(16000, dtype=np.float32)
        await asyncio.gather(*(worker.submit(Job("s", i, silence, "final")) for i in range(3)))
        await asyncio.wait_for(emptied.wait(), 60)
        emptied.clear()
        await worker.submit(Job("s", 3, silence, "final"))
        await asyncio.wait_for(emptied.wait(), 60)
        await worker.stop()
        return idle

    assert asyncio.run(scenario()) == [3, 4]


def test_a_speculative_final_counts_only_once_its_session_adopts_it(engine, clips):
    """A session queues a segment's final at a pause; if speech resumes the job is withdrawn, decoded or not. The
    finals counter (`realtime_finals_total`) counts the finals a session took, not the withdrawn decodes (a fast
    engine finished one inside a comma's pause, and the live metrics test read 4 finals for 3)."""
    async def scenario() -> tuple[int, int, int]:
        worker = Worker(engine)
        worker.start()
        withdrawn = Job("s", 0, clips[0], "final", speculative=True)
        adopted_late = Job("s", 0, clips[0], "final", speculative=True)
        await asyncio.gather(worker.submit(withdrawn), worker.submit(adopted_late))
        after_decodes = worker.stats.finals
        worker.cancel(withdrawn)
        worker.adopt(adopted_late)
        adopted_early = Job("s", 1, clips[1], "final", speculative=True)
        future = worker.submit(adopted_early)
        worker.adopt(adopted_early)
        await future
        await worker.submit(Job("s", 2, clips[2], "final"))
        await worker.stop()
        return after_decodes, worker.stats.finals - after_decodes, worker.stats.finals

    assert asyncio.run(scenario()) == (0, 3, 3)
