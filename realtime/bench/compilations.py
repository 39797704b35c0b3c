"""`python -m realtime bench file --random N`: speech lost on recordings no one has tried before.

N random compilations of a manifest's clips (`corpus.random_compilation`, seeds from `--seed` on), each transcribed
by the file path's text and timed decodes (with `--served`, also a launched app's HTTP API: json, verbose_json,
SSE, and the remote engine of a second app sending its windows to the first; with `--engines`, an app on the vLLM
engine and a remote engine sending to a Ray Serve pool) and by faster-whisper's `transcribe` on the same weights.
A stretch of 5 or more words that a pipeline writes for a clip posted alone and leaves out of its answer for the
compilation is lost (`corpus.lost_speech`: against that pipeline's own readings of the clips alone, numbers
normalised alike). Beside the lost stretches: WER against the manifest's texts and RTFx over all the compilations.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..audio import SAMPLE_RATE, decode_file
from .common import _machine, post_file, write_outputs
from .corpus import LOST_RUN_WORDS, Compilation, corpus_wer, lost_speech, random_compilation, read_manifest

LONGEST_CLIP_S = 40.0
"""Clips up to this long are drawn (the manifest's long recordings are left to the long-form benchmarks)."""


def _pipelines(model_dir: str, compute_type: str, language: str | None,
               only: list[str] | None) -> dict[str, Callable[[Path], str]]:
    from .files import file_contenders

    every = file_contenders(model_dir, compute_type, None, language)
    return {k: v for k, v in every.items() if not k.startswith("faster-whisper batched")
            and (only is None or k.startswith("faster-whisper") or any(k.lower().startswith(o) for o in only))}


def _served(out: Path) -> tuple[dict[str, Callable[[Path], str]], Callable[[], None]]:
    """The paths of a launched app (embedded engine) over HTTP: `json`, `verbose_json` and SSE (`stream=true`), and
    a second app whose remote engine sends its windows to the first (`json`); and a function that stops both."""
    from .stream import _launch

    app, port = _launch(4, log=out / "app.log")
    front, front_port = _launch(4, "--engine", "remote", "--remote-url",
                                f"http://127.0.0.1:{port}/v1/audio/transcriptions", "--remote-timeout", "600",
                                log=out / "front.log")

    def sse(path: Path) -> str:
        for line in post_file(port, path, response_format="json", stream="true").text.splitlines():
            if line.startswith("data: ") and (doc := json.loads(line[6:])).get("type") == "transcript.text.done":
                return str(doc["text"])
        raise RuntimeError("the stream ended without transcript.text.done")

    def stop() -> None:
        for proc in (front, app):
            proc.terminate()
            proc.wait(30)

    return {
        "HTTP json": lambda p: str(post_file(port, p, response_format="json").json()["text"]),
        "HTTP verbose_json": lambda p: str(post_file(port, p, response_format="verbose_json").json()["text"]),
        "HTTP SSE (stream=true)": sse,
        "remote engine to another instance (json)": lambda p: str(post_file(front_port, p,
                                                                         response_format="json").json()["text"]),
    }, stop


def _engines(names: list[str], out: Path) -> tuple[dict[str, Callable[[Path], str]], Callable[[], None]]:
    """The other engines a launched app serves: 'vllm', the HTTP API's json on `--engine vllm`; 'pool', a remote
    engine sending to a Ray Serve engine pool (`python -m realtime pool`, one replica); and a function that stops
    them."""
    import subprocess

    from .pool import _Pool
    from .stream import _launch

    apps: list[subprocess.Popen[bytes]] = []
    pools: list[_Pool] = []
    runs: dict[str, Callable[[Path], str]] = {}

    def text(at: int, path: Path) -> str:
        return str(post_file(at, path, response_format="json").json()["text"])

    def stop() -> None:
        for proc in reversed(apps):
            proc.terminate()
            proc.wait(60)
        for pool in pools:
            pool.stop()

    try:
        if "vllm" in names:
            app, port = _launch(4, "--engine", "vllm", log=out / "vllm-app.log")
            apps.append(app)
            runs["vLLM engine (HTTP json)"] = lambda p, at=port: text(at, p)
        if "pool" in names:
            pools.append(pool := _Pool("1:1", 1.0, time.monotonic(), out / "pool.log", cpu_threads=None))
            if not pool.ready.wait(300):
                raise RuntimeError(f"the pool did not start (see {out / 'pool.log'})")
            front, front_port = _launch(4, "--engine", "remote", "--remote-url", pool.route, "--remote-timeout",
                                        "600", log=out / "pool-front.log")
            apps.append(front)
            runs["remote engine to a Ray Serve pool (json)"] = lambda p, at=front_port: text(at, p)
    except BaseException:
        stop()
        raise
    return runs, stop


def lost_anywhere(doc: dict[str, Any]) -> bool:
    """Whether a run (`bench_random`'s document) lost speech, or met an error, in any pipeline of this app, in process
    or served (faster-whisper's, beside them for comparison, does not count)."""
    return any(r["lost_runs"] or r.get("errors") for r in doc["results"] if not r["name"].startswith("faster-whisper"))


def _document(rows: dict[str, dict[str, Any]], refs: list[str], seeds: list[int], seconds: float, manifest: Path,
              model_name: str, compute_type: str, jobs: int = 1) -> tuple[dict[str, Any], str]:
    """The run's document and table over the compilations done so far (`seeds`); no RTFx where pipelines ran side
    by side (`jobs` > 1), as each one's time then holds the others'."""
    from .files import _percent

    results = []
    for r in rows.values():
        results.append({"name": r["name"], "rtfx": round(seconds / max(r["wall_s"], 1e-9), 2) if jobs == 1 else None,
                        "wer": round(corpus_wer(refs, r["texts"]), 4),
                        "lost_runs": len(r["lost"]), "compilations_with_loss": len({x["seed"] for x in r["lost"]}),
                        "lost": r["lost"], "errors": r["errors"]})
    first, last = seeds[0], seeds[-1]
    doc = {"kind": "file-random", "seeds": [first, last], "compilations": len(seeds),
           "audio_seconds": round(seconds, 1), "model": model_name, "compute_type": compute_type,
           "decoding": "greedy (beam 1), English", "machine": _machine(), "jobs": jobs, "results": results}
    table = (f"File transcription of {len(seeds)} random compilations of {manifest}'s clips (seeds {first} to "
             f"{last}, {seconds / 60:.0f} min in all), {model_name} {compute_type}, greedy, "
             f"{_machine()}. Lost: stretches of {LOST_RUN_WORDS} or more words that the pipeline writes for a clip "
             "alone and leaves out of the compilation's answer."
             + (f" Pipelines ran {jobs} side by side: no RTFx." if jobs > 1 else "") + "\n\n"
             "| pipeline | lost stretches | compilations with a loss | errors | WER | RTFx |\n"
             "|---|---|---|---|---|---|\n"
             + "\n".join(f"| {r['name']} | {r['lost_runs']} | {r['compilations_with_loss']} | {len(r['errors'])} | "
                         f"{_percent(r['wer'])} | {'–' if r['rtfx'] is None else r['rtfx']} |" for r in results) + "\n")
    return doc, table


def bench_random(args: argparse.Namespace) -> dict[str, Any]:
    from .files import _bench_model

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # a run stopped with SIGTERM stops the apps and the pool it launched on its way out, as Ctrl-C does
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    manifest = Path(args.audio if args.audio and args.audio.endswith(".tsv") else "tests/data/manifest.tsv")
    clips = read_manifest(manifest, longest=LONGEST_CLIP_S)
    model_dir, model_name, compute_type, language = _bench_model(args.model, args.compute_type, out / "models")
    only = [o.strip().lower() for o in args.only.split(",")] if args.only else None
    pipelines = _pipelines(model_dir, compute_type, language, only)
    lanes = [list(pipelines)]
    launched = contextlib.ExitStack()  # the apps and the pool, stopped on the way out or when a later launch fails
    engines = [e.strip().lower() for e in (getattr(args, "engines", "") or "").split(",") if e.strip()]
    try:
        if args.served:
            served, stop = _served(out)
            launched.callback(stop)
            pipelines.update(served)
            lanes += [[name] for name in served]
        if engines:
            more, stop = _engines(engines, out)
            launched.callback(stop)
            pipelines.update(more)
            lanes += [[name] for name in more]
    except BaseException:
        launched.close()
        raise
    first = args.seed if args.seed is not None else int(time.time()) % 100000
    print(f"random compilations: seeds {first} to {first + args.random - 1}", file=sys.stderr, flush=True)
    alone: dict[str, dict[str, str]] = {name: {} for name in pipelines}
    rows: dict[str, dict[str, Any]] = {name: {"name": name, "wall_s": 0.0, "lost": [], "texts": [], "errors": []}
                                       for name in pipelines}
    refs: list[str] = []
    seeds: list[int] = []
    seconds = 0.0
    jobs = max(1, getattr(args, "jobs", 1) or 1)
    began = time.monotonic()

    def lane(names: list[str], comp: Compilation, seed: int) -> None:
        """The compilation through the lane's pipelines in turn, each with its readings of the clips alone."""
        for name in names:
            run = pipelines[name]
            for clip in comp.clips:
                if clip.name not in alone[name]:
                    alone[name][clip.name] = run(clip.path)
            t0 = time.perf_counter()
            try:
                answer = run(comp.path)
            except Exception as exc:  # an explicit error, not speech lost silently: counted apart, not as lost
                rows[name]["errors"].append({"seed": seed, "error": f"{type(exc).__name__}: {exc}"})
                rows[name]["texts"].append("")
                continue
            rows[name]["wall_s"] += time.perf_counter() - t0
            rows[name]["texts"].append(answer)
            for run_ in lost_speech(comp, alone[name], answer):  # with the texts, to be read again
                rows[name]["lost"].append({"seed": seed, "words": run_, "answer": answer,
                                           "alone": [alone[name][c.name] for c in comp.clips]})

    with tempfile.TemporaryDirectory() as tmp, launched, ThreadPoolExecutor(jobs) as side:
        for seed in range(first, first + args.random):
            comp = random_compilation(clips, Path(tmp) / f"compilation-{seed}.wav", seed)
            seconds += decode_file(comp.path).size / SAMPLE_RATE
            refs.append(comp.text)
            # each pipeline keeps to its own row and readings, so lanes may run side by side; the in-process
            # pipelines share an engine and keep to one lane; the slowest lanes so far start first
            lanes.sort(key=lambda names: -sum(rows[n]["wall_s"] for n in names))
            for done in [side.submit(lane, names, comp, seed) for names in lanes]:
                done.result()
            lost = {n: sum(x["seed"] == seed for x in r["lost"]) for n, r in rows.items()}
            print(f"seed {seed} ({len(comp.clips)} clips, {comp.spans[-1][1]:.0f} s, "
                  f"{(time.monotonic() - began) / 60:.0f} min in): lost {lost}",
                  file=sys.stderr, flush=True)
            seeds.append(seed)  # the figures so far, kept on disk: a run stopped early still has them
            doc, table = _document(rows, refs, seeds, seconds, manifest, model_name, compute_type, jobs)
            (out / "bench-file-random.json").write_text(json.dumps(doc, indent=2))
            (out / "bench-file-random.md").write_text(table)
    doc, table = _document(rows, refs, seeds, seconds, manifest, model_name, compute_type, jobs)
    write_outputs(out, "file-random", doc, table, lambda p: None)
    return doc
