"""The engine pool: the app's engine as a Ray Serve application (`python -m realtime pool`).

This module owns the pool: one Serve deployment whose replicas each hold a TranscriptionService (an engine
made by `create_engine` from the pool's Settings and the app's worker, which batches the requests a replica
has in flight), and serve the app's own HTTP API (realtime/web/api.py: `/v1/audio/transcriptions` in every
response format, SSE streaming, translations, `/v1/models`) plus `/health` (the replica's readiness, process
id, the API requests it holds and queue figures) on Serve's HTTP proxy. A fixed number of replicas
(`--replicas`) or autoscaling on ongoing requests (`--autoscale MIN:MAX`, `--target-ongoing-requests`,
`--upscale-delay`, `--downscale-delay`). Without `--address` it starts a local Ray cluster bound to
127.0.0.1 with no dashboard and no usage statistics; with it, it joins an existing cluster. The app's remote
engine (`--engine remote --remote-url http://HOST:PORT/v1/audio/transcriptions`) is its front end.

Ray is an optional extra (requirements-pool.txt), imported only here.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from ..config import Settings, add_arguments, from_namespace

log = logging.getLogger(__name__)

APP_NAME = "transcription"
DEPLOYMENT_NAME = "EnginePool"
ROOT = Path(__file__).resolve().parents[2]
POOL_FLAGS = ("api_key", "max_upload_mb", "api_max_requests", "max_pending_audio_s", "log_level")
PASSED_ENV = ("HF_HUB_OFFLINE", "HF_HOME", "HF_TOKEN", "RAY_USAGE_STATS_ENABLED", "REALTIME_VLLM_PYTHON")


@dataclasses.dataclass(frozen=True)
class Scaling:
    """Replica count, fixed (`min_replicas == max_replicas`) or autoscaled between the two."""

    min_replicas: int
    max_replicas: int
    target_ongoing_requests: float = 2.0
    upscale_delay_s: float = 3.0
    downscale_delay_s: float = 20.0

    @property
    def autoscaled(self) -> bool:
        return self.max_replicas > self.min_replicas

    def deployment_options(self) -> dict[str, Any]:
        if not self.autoscaled:
            return {"num_replicas": self.min_replicas}
        return {"autoscaling_config": {
            "min_replicas": self.min_replicas, "initial_replicas": self.min_replicas,
            "max_replicas": self.max_replicas, "target_ongoing_requests": self.target_ongoing_requests,
            "upscale_delay_s": self.upscale_delay_s, "downscale_delay_s": self.downscale_delay_s,
            "metrics_interval_s": 1.0, "look_back_period_s": 5.0,
        }}


def parse_autoscale(raw: str) -> tuple[int, int]:
    lo, sep, hi = raw.partition(":")
    if not sep or not lo.strip().isdigit() or not hi.strip().isdigit():
        raise argparse.ArgumentTypeError(f"--autoscale takes MIN:MAX, e.g. 1:4 (got {raw!r})")
    a, b = int(lo), int(hi)
    if a < 1 or b < a:
        raise argparse.ArgumentTypeError(f"--autoscale needs 1 <= MIN <= MAX (got {raw!r})")
    return a, b


API_PATHS = ("/v1/audio/", "/api/v1/audio/")


class _InProgress:
    """The transcription requests (`API_PATHS`) a replica holds, counted from the request's start until the last
    byte of its response is handed on: an upload still arriving (a slow client's) counts, as it holds one of the
    replica's `max_ongoing_requests`. `GET /health` reports it as `requests`."""

    def __init__(self) -> None:
        self.count = 0

    def middleware(self, app: Any) -> Any:
        """`app` wrapped as a pure ASGI app that keeps the count."""

        async def counted(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] != "http" or not str(scope.get("path", "")).startswith(API_PATHS):
                await app(scope, receive, send)
                return
            self.count += 1
            done = False

            def finish() -> None:
                nonlocal done
                if not done:
                    done = True
                    self.count -= 1

            async def sending(message: dict[str, Any]) -> None:
                if message["type"] == "http.response.body" and not message.get("more_body", False):
                    finish()  # before the last byte leaves: a client that has its answer sees the count without it
                await send(message)

            try:
                await app(scope, receive, sending)
            finally:
                finish()

        return counted


def replica_app(settings: Settings) -> Any:
    """The ASGI app of one replica (built on the replica): the app's API router on its own service."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    from ..live.service import TranscriptionService
    from ..web.api import create_router

    logging.basicConfig(level=getattr(logging, settings.log_level.upper(), logging.INFO),
                        format="%(levelname)s %(name)s: %(message)s")
    service = TranscriptionService(settings)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await service.start()  # the replica is not counted as running until its engine is loaded
        try:
            yield
        finally:
            await service.stop()

    app = FastAPI(lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.include_router(create_router(service, lane_hints=True))
    held = _InProgress()
    app.add_middleware(held.middleware)

    @app.get("/health", include_in_schema=False)
    async def health() -> JSONResponse:
        import ray
        from ray import serve

        ready = service.ready and service.engine.ready
        worker = service.worker
        body: dict[str, Any] = {
            "status": "ok" if ready else "starting", "ready": ready, "pid": os.getpid(),
            "replica": serve.get_replica_context().replica_id.unique_id,
            "node_ip": ray.util.get_node_ip_address(), "requests": held.count,
            **service.engine.describe(),
            "queue": {"files": worker.pending_files, "done": worker.stats.files,
                      "engine_latency_s": round(worker.stats.engine_latency, 4)} if worker else {},
        }
        return JSONResponse(body, status_code=200 if ready else 503)

    return app


def build_application(settings: Settings, scaling: Scaling, replica_cpus: float = 1.0,
                      replica_gpus: float = 0.0, max_ongoing_requests: int | None = None) -> Any:
    """The Serve application: the engine deployment bound to `settings` (not yet deployed)."""
    from ray import serve

    env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    ongoing = max_ongoing_requests or settings.api_max_requests or 16

    def build() -> Any:  # Serve takes a builder only when it is a plain function
        return replica_app(settings)

    ingress = serve.ingress(build)
    deployment = serve.deployment(ingress(), name=DEPLOYMENT_NAME).options(
        max_ongoing_requests=ongoing,
        ray_actor_options={"num_cpus": replica_cpus, "num_gpus": replica_gpus,
                           "runtime_env": {"env_vars": env}},
        health_check_period_s=2.0, health_check_timeout_s=30.0,
        graceful_shutdown_timeout_s=20.0,
        **scaling.deployment_options(),
    )
    return deployment.bind()


def app(args: dict[str, str]) -> Any:
    """An application builder for Serve configs (`serve run realtime.pool:app replicas=2`, KubeRay's
    serveConfigV2 `import_path: realtime.pool:app`): `replicas` or `autoscale` (MIN:MAX),
    `target_ongoing_requests`, `upscale_delay_s`, `downscale_delay_s`, `replica_cpus`, `replica_gpus`,
    `max_ongoing_requests`, and any Settings field (`model`, `engine`, `cpu_threads`, ...)."""
    args = {k.replace("-", "_"): str(v) for k, v in args.items()}
    lo, hi = parse_autoscale(args.pop("autoscale")) if "autoscale" in args else (int(args.pop("replicas", "1")),) * 2
    scaling = Scaling(lo, hi, target_ongoing_requests=float(args.pop("target_ongoing_requests", "2")),
                      upscale_delay_s=float(args.pop("upscale_delay_s", Scaling.upscale_delay_s)),
                      downscale_delay_s=float(args.pop("downscale_delay_s", Scaling.downscale_delay_s)))
    cpus, gpus = args.pop("replica_cpus", None), args.pop("replica_gpus", None)
    ongoing = args.pop("max_ongoing_requests", None)
    unknown = set(args) - set(Settings.__dataclass_fields__)
    if unknown:
        raise ValueError(f"unknown pool arguments: {', '.join(sorted(unknown))}")
    settings = from_namespace(argparse.Namespace(**args))
    return build_application(
        settings, scaling, replica_cpus=float(cpus) if cpus else float(settings.cpu_threads or 1),
        replica_gpus=float(gpus) if gpus else (1.0 if settings.engine == "vllm" else 0.0),
        max_ongoing_requests=int(ongoing) if ongoing else None)


RAY_START_ATTEMPTS = 3


def _descendants(pid: int) -> list[int]:
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:  # gone meanwhile
                continue
            parents.setdefault(int(stat[stat.rfind(")") + 2:].split()[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def _stop_children() -> None:
    """Stop what a failed local start left (its GCS, raylet and agents are this process's only children then)."""
    for child in _descendants(os.getpid()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
    for child in _descendants(os.getpid()):  # reap the ones that were ours
        with contextlib.suppress(ChildProcessError):
            os.waitpid(child, 0)


def start_ray(address: str | None, num_cpus: float | None, num_gpus: int | None) -> None:
    """Join the cluster at `address`, or start a local one on loopback (no dashboard, no usage statistics)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if not address:
        # ray.init and `ray start` turn a node address of 127.0.0.1 into the machine's own address; a
        # single-machine cluster (this variable off) keeps every Ray process on loopback
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        # Ray runs its workers at nice 15: replicas are the service here, not background tasks
        os.environ.setdefault("RAY_worker_niceness", "0")
    import ray

    env = {"env_vars": {"PYTHONPATH": str(ROOT)}}
    if address:
        ray.init(address=address, runtime_env=env, logging_level=logging.WARNING, log_to_driver=False)
        return
    for attempt in range(1, RAY_START_ATTEMPTS + 1):
        try:
            ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False, num_cpus=num_cpus,
                     num_gpus=num_gpus, runtime_env=env, logging_level=logging.WARNING, log_to_driver=False)
            return
        except Exception as exc:
            # Ray gives its raylet a fixed 30 s to register; a busy machine can miss it, and a second start
            # (its files cached by the first) is quicker
            if "timed out during startup" not in str(exc) or attempt == RAY_START_ATTEMPTS:
                raise
            log.warning("the local Ray node did not start in time (try %d of %d); starting it again",
                        attempt, RAY_START_ATTEMPTS)
            ray.shutdown()
            _stop_children()


def deploy(settings: Settings, scaling: Scaling, host: str, port: int, **options: Any) -> None:
    from ray import serve

    serve.start(http_options={"host": host, "port": port})
    serve.run(build_application(settings, scaling, **options), name=APP_NAME, route_prefix="/", blocking=False)


def replica_count() -> int:
    """Running replicas of the pool's deployment."""
    from ray import serve

    status = serve.status().applications[APP_NAME].deployments[DEPLOYMENT_NAME]
    return int(status.replica_states.get("RUNNING", 0))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m realtime pool", description=__doc__.split("\n\n")[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--replicas", type=int, default=None, help="a fixed number of engine replicas (default 1)")
    size.add_argument("--autoscale", type=parse_autoscale, default=None, metavar="MIN:MAX",
                      help="autoscale between MIN and MAX replicas on ongoing requests")
    parser.add_argument("--target-ongoing-requests", type=float, default=2.0,
                        help="autoscaling: requests in flight per replica that the autoscaler aims at")
    parser.add_argument("--upscale-delay", type=float, default=Scaling.upscale_delay_s, metavar="S",
                        help="autoscaling: seconds above the target before a replica is added")
    parser.add_argument("--downscale-delay", type=float, default=Scaling.downscale_delay_s, metavar="S",
                        help="autoscaling: seconds below the target before a replica is removed")
    parser.add_argument("--address", default=None,
                        help="Ray cluster to join (ray://HOST:10001 or HOST:6379); empty: start a local one on "
                             "127.0.0.1")
    parser.add_argument("--http-host", default="127.0.0.1", help="where Serve's HTTP proxy listens")
    parser.add_argument("--port", type=int, default=8000, help="Serve's HTTP port")
    parser.add_argument("--replica-cpus", type=float, default=None,
                        help="CPUs Ray reserves per replica (default: --cpu-threads, else 1)")
    parser.add_argument("--replica-gpus", type=float, default=None,
                        help="GPUs per replica (default: 1 with --engine vllm, else 0)")
    parser.add_argument("--max-ongoing-requests", type=int, default=None,
                        help="requests a replica takes at once; the proxy queues the rest (default: "
                             "--api-max-requests)")
    from ..config import ENGINE_FLAGS

    add_arguments(parser, only=ENGINE_FLAGS + POOL_FLAGS)
    args = parser.parse_args(argv)
    settings = from_namespace(args)
    lo, hi = args.autoscale or ((args.replicas or 1),) * 2
    if lo < 1:
        parser.error("--replicas must be at least 1")
    scaling = Scaling(lo, hi, target_ongoing_requests=args.target_ongoing_requests,
                      upscale_delay_s=args.upscale_delay, downscale_delay_s=args.downscale_delay)
    cpus = args.replica_cpus if args.replica_cpus is not None else float(settings.cpu_threads or 1)
    gpus = args.replica_gpus if args.replica_gpus is not None else (1.0 if settings.engine == "vllm" else 0.0)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    # a local cluster gets room for MAX replicas even on a small machine (replicas share its cores then)
    local_cpus = max(float(os.cpu_count() or 1), hi * cpus) if not args.address else None
    local_gpus = int(max(hi * gpus, 0)) if gpus and not args.address else None
    start_ray(args.address, local_cpus, local_gpus)
    from ray import serve

    stopping = threading.Event()
    deployed = False

    def on_signal(*_: Any) -> None:
        stopping.set()
        if not deployed:
            raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    try:
        deploy(settings, scaling, args.http_host, args.port, replica_cpus=cpus, replica_gpus=gpus,
               max_ongoing_requests=args.max_ongoing_requests)
        while not stopping.is_set() and replica_count() < scaling.min_replicas:
            time.sleep(0.2)
        deployed = True
        what = f"{lo}-{hi} replicas, autoscaled" if scaling.autoscaled else f"{lo} replicas"
        print(f"pool ready: http://{args.http_host}:{args.port}/v1/audio/transcriptions ({what}, engine "
              f"{settings.engine})", flush=True)
        started, last = time.monotonic(), -1
        while not stopping.wait(1.0):
            with contextlib.suppress(Exception):  # the controller may be busy; ask again next second
                n = replica_count()
                if n != last:
                    print(f"replicas: {n} at {time.monotonic() - started:.1f} s", flush=True)
                    last = n
    finally:
        import ray

        with contextlib.suppress(Exception):
            if args.address:
                serve.delete(APP_NAME)
            else:
                serve.shutdown()
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
