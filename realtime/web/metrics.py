"""Prometheus metrics of one app instance, served as text at `GET /metrics`.

Each app has its own `CollectorRegistry` (never the global default), so several apps in one process do not
clash. What is measured, and where:
- sessions opened (counter) and open now, queue depth per lane (finals, files, partials) and the worker's
  counters (finals, partials, files, partials shed, engine errors): read from the service at scrape time;
- final latency (`FinalEvent.latency`: end of speech to final text) and first-partial latency (speech start
  event to the segment's first partial, wall clock) histograms: from the events every live session emits,
  observed by wrapping the session's callback in `TranscriptionService.open_session`;
- engine batch size and seconds per batch, and the engine's seconds per lane: the worker's `on_batch` hook;
- real-time factor: the audio seconds of the jobs the engine completed, per lane (counted by wrapping the
  worker's `submit`), beside the engine's busy seconds (the batch seconds' sum); `realtime_real_time_factor`
  is their ratio since start (engine seconds per second of audio: under 1 keeps up), and
  `rate(realtime_engine_batch_seconds_sum[5m]) / rate(realtime_audio_seconds_total[5m])` the recent one;
- engine restarts: the vLLM engine's supervisor restarts its process and counts it (`restarts` in its
  `describe()`, read at scrape time; 0 for engines that run no process of their own);
- HTTP requests by route template, method and status, and upload bytes of the transcription API: a middleware.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response

from ..audio import SAMPLE_RATE
from ..engines import Transcription
from ..live.events import Event, FinalEvent, PartialEvent, SpeechStarted
from ..live.service import TranscriptionService
from ..live.worker import Job

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)
_KNOWN_PREFIXES = ("/v1/", "/api/v1/", "/webrtc/", "/transcript/", "/health", "/metrics")


class _ServiceCollector(Collector):
    """Gauges and counters read from the service when Prometheus scrapes."""

    def __init__(self, service: TranscriptionService) -> None:
        self.service = service

    def collect(self) -> Iterator[Any]:
        service, worker = self.service, self.service.worker
        yield GaugeMetricFamily("realtime_sessions_open", "live transcription sessions open now",
                                value=len(service.sessions))
        yield GaugeMetricFamily("realtime_ready", "1 when the service and its engine are ready",
                                value=float(service.ready and service.engine.ready))
        queue = GaugeMetricFamily("realtime_queue_depth", "jobs waiting for the engine, per lane", labels=["lane"])
        for lane, depth in (("finals", worker.pending_finals if worker else 0),
                            ("files", worker.pending_files if worker else 0),
                            ("partials", worker.pending_partials if worker else 0)):
            queue.add_metric([lane], depth)
        yield queue
        stats = worker.stats if worker else None
        for name, attr, doc in (("realtime_finals", "finals", "final transcripts of live segments"),
                                ("realtime_partials", "partials", "partial transcripts of open segments"),
                                ("realtime_file_jobs", "files", "file jobs (API uploads, windows) done"),
                                ("realtime_partials_shed", "partials_shed",
                                 "partials dropped because a newer one of the same session replaced them"),
                                ("realtime_engine_errors", "errors", "engine failures on a job")):
            yield CounterMetricFamily(name, doc, value=getattr(stats, attr) if stats else 0)
        yield GaugeMetricFamily("realtime_engine_latency_seconds",
                                "moving average of the engine's seconds per job",
                                value=stats.engine_latency if stats else 0.0)
        yield CounterMetricFamily("realtime_denoised_audio_seconds", "seconds of audio the denoiser cleaned for "
                                  "Realtime sessions asking for noise_reduction", value=service.denoised_seconds)
        restarts = service.engine.describe().get("restarts") or 0
        yield CounterMetricFamily("realtime_engine_restarts", "engine process restarts (the vLLM engine's "
                                  "supervisor; 0 for engines without a process of their own)", value=restarts)


class Metrics:
    """The registry of one app and the hooks that feed it."""

    def __init__(self, service: TranscriptionService) -> None:
        self.service = service
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.sessions = Counter("realtime_sessions", "live sessions opened", registry=r)
        self.final_latency = Histogram("realtime_final_latency_seconds", "end of speech to the final text",
                                       buckets=LATENCY_BUCKETS, registry=r)
        self.first_partial_latency = Histogram("realtime_first_partial_latency_seconds",
                                               "speech start to the segment's first partial",
                                               buckets=LATENCY_BUCKETS, registry=r)
        self.batch_size = Histogram("realtime_engine_batch_size", "jobs per engine batch",
                                    buckets=(1, 2, 4, 8, 16, 32), registry=r)
        self.batch_seconds = Histogram("realtime_engine_batch_seconds", "seconds per engine batch",
                                       buckets=LATENCY_BUCKETS, registry=r)
        self.requests = Counter("realtime_http_requests", "HTTP requests by route, method and status",
                                ["route", "method", "status"], registry=r)
        self.upload_bytes = Counter("realtime_api_upload_bytes", "bytes uploaded to the transcription API",
                                    registry=r)
        self.engine_seconds = Counter("realtime_engine_seconds", "seconds the engine spent on batches, per lane "
                                      "(final, partial, file)", ["lane"], registry=r)
        self.audio_seconds = Counter("realtime_audio_seconds", "seconds of audio in the jobs the engine completed, "
                                     "per lane (a partial counts the segment's audio so far)", ["lane"], registry=r)
        for lane in ("final", "partial", "file"):
            self.audio_seconds.labels(lane)
            self.engine_seconds.labels(lane)
        self._busy_s = 0.0
        self._audio_s = 0.0
        Gauge("realtime_real_time_factor", "engine seconds per second of audio it transcribed, since start (below 1: "
              "faster than real time)", registry=r).set_function(
            lambda: self._busy_s / self._audio_s if self._audio_s else 0.0)
        r.register(_ServiceCollector(service))
        self._hooked_worker: Any = None

    def attach(self) -> None:
        """Hook the service: sessions' events, and the worker's batches once it exists."""
        open_session = self.service.open_session

        def observed_open(session_id: str, on_event: Callable[[Event], None], *args: Any, **kw: Any) -> Any:
            known = session_id in self.service.sessions
            session = open_session(session_id, self._observe(on_event), *args, **kw)
            if not known:
                self.sessions.inc()
            self.hook_worker()
            return session

        self.service.open_session = observed_open  # type: ignore[method-assign]
        self.hook_worker()

    def hook_worker(self) -> None:
        worker = self.service.worker
        if worker is not None and worker is not self._hooked_worker:
            worker.on_batch = self._on_batch
            submit = worker.submit

            def counted_submit(job: Job) -> asyncio.Future[Transcription]:
                future = submit(job)
                future.add_done_callback(lambda f: self._job_done(job, f))
                return future

            worker.submit = counted_submit  # type: ignore[method-assign]
            self._hooked_worker = worker

    def _on_batch(self, size: int, seconds: float, lane: str) -> None:
        self.batch_size.observe(size)
        self.batch_seconds.observe(seconds)
        self.engine_seconds.labels(lane).inc(seconds)
        self._busy_s += seconds

    def _job_done(self, job: Job, future: asyncio.Future[Transcription]) -> None:
        if future.cancelled() or future.exception() is not None:
            return
        seconds = job.audio.size / SAMPLE_RATE
        self.audio_seconds.labels(job.kind).inc(seconds)
        self._audio_s += seconds

    def _observe(self, on_event: Callable[[Event], None]) -> Callable[[Event], None]:
        started: dict[int, float] = {}

        def observed(event: Event) -> None:
            if isinstance(event, SpeechStarted):
                started[event.segment] = time.monotonic()
            elif isinstance(event, PartialEvent) and event.segment in started:
                self.first_partial_latency.observe(time.monotonic() - started.pop(event.segment))
            elif isinstance(event, FinalEvent):
                started.pop(event.segment, None)
                self.final_latency.observe(event.latency)
            on_event(event)

        return observed

    async def middleware(self, request: Request, call_next: Callable[[Request], Any]) -> Response:
        self.hook_worker()  # the worker exists once the service started: API uploads count from the first one
        path = request.url.path
        if path.startswith(("/v1/audio/", "/api/v1/audio/")) and request.method == "POST":
            length = request.headers.get("content-length", "")
            if length.isdigit():
                self.upload_bytes.inc(int(length))
        response: Response = await call_next(request)
        route = request.scope.get("route")
        template = getattr(route, "path", None) if path.startswith(_KNOWN_PREFIXES) else None
        self.requests.labels(template or "other", request.method, str(response.status_code)).inc()
        return response

    def render(self) -> Response:
        self.hook_worker()
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE)
