"""`python -m realtime bench KIND`: the command line of every benchmark (each in its own module)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from . import __doc__ as BENCHMARKS
from .files import bench_file
from .quant import _quant_one, bench_quant
from .soak import bench_soak
from .stream import bench_stream


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m realtime bench", description=BENCHMARKS,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="kind", required=True)
    f = sub.add_parser("file", help="long-form transcription RTFx and WER against faster-whisper and transformers")
    f.add_argument("--audio", help="an audio file, or a manifest (.tsv, as tests/data/manifest.tsv) whose clips are "
                                   "transcribed one file each (default: a synthesized multi-voice recording)")
    f.add_argument("--text", help="its reference transcript (a text file)")
    f.add_argument("--joined", type=float, metavar="PAUSE_S",
                   help="with a manifest: its clips joined into one long recording, with pauses of this many seconds")
    f.add_argument("--minutes", type=float, default=10.0, help="length of the synthesized recording")
    f.add_argument("--random", type=int, metavar="N",
                   help="N random compilations of a manifest's clips (--audio, default tests/data/manifest.tsv): the "
                        "speech each pipeline loses against its reading of the clips alone (one run each)")
    f.add_argument("--seed", type=int, help="with --random: the first compilation's seed (default: from the clock)")
    f.add_argument("--served", action="store_true", help="with --random: also a launched app's HTTP API (json, "
                                                          "verbose_json, SSE) and a remote engine sending to it")
    f.add_argument("--engines", default="", help="with --random: comma-separated engines also served by a launched "
                                                 "app: 'vllm' (its HTTP API's json on the vLLM engine), 'pool' (a "
                                                 "remote engine sending to a Ray Serve engine pool)")
    f.add_argument("--jobs", type=int, default=1, help="with --random: how many pipelines transcribe a compilation "
                                                      "side by side (above 1, no RTFx: each time holds the others')")
    f.add_argument("--model", help="tiny.en (default: the bundled one), base (multilingual, from its packages) or a "
                                   "CTranslate2 directory")
    f.add_argument("--compute-type", help="default: int8 for tiny.en, float32 for base")
    f.add_argument("--runs", type=int, default=3)
    f.add_argument("--logprobs", action="store_true",
                   help="also the realtime pipelines asking for each token's log probability (issue 41's cost)")
    f.add_argument("--only", help="comma-separated name prefixes of the pipelines to run (realtime, transformers, "
                                  "vllm, faster-whisper batched); faster-whisper sequential always runs")
    f.add_argument("--out", default="bench-out")
    s = sub.add_parser("stream", help="live latency with N concurrent WebRTC clients")
    s.add_argument("--clients", default="1,2,4,8,16")
    s.add_argument("--audio", help="what every client plays: a recording (with --text), or a manifest (.tsv) whose "
                                   "short clips are joined with pauses (default: synthesized sentences)")
    s.add_argument("--text", help="the recording's reference transcript (a text file)")
    s.add_argument("--seconds", type=float, default=180.0, help="speech taken from a manifest (s)")
    s.add_argument("--order", choices=("own", "same"), default="own",
                   help="from a manifest: each client plays the utterances in an order of its own (independent "
                        "speakers), or all in the same order, their pauses together (the worst case)")
    s.add_argument("--runs", type=int, default=1)
    s.add_argument("--idle-seconds", type=float, default=10.0,
                   help="how long the app's idle CPU is sampled, with no session and with one silent client")
    s.add_argument("--url", help="a running app (default: launch one)")
    s.add_argument("--pid", type=int, help="the running app's process id, for CPU figures")
    s.add_argument("--out", default="bench-out")
    k = sub.add_parser("soak", help="N clients stream real speech for M minutes: RSS, open fds, latency, losses")
    k.add_argument("--minutes", type=float, default=20.0)
    k.add_argument("--clients", type=int, default=4)
    k.add_argument("--audio", help="what every client plays, again and again: a recording (with --text), or a "
                                   "manifest (.tsv) whose short clips are joined with pauses (default: "
                                   "tests/data/manifest.tsv)")
    k.add_argument("--text", help="the recording's reference transcript (a text file)")
    k.add_argument("--seconds", type=float, default=40.0, help="speech taken from a manifest (s): one round")
    k.add_argument("--warmup-minutes", type=float, help="growth is measured after this (default: 5, at most a "
                                                        "quarter of the run)")
    k.add_argument("--sample-s", type=float, help="seconds between samples (default: 60, at most a tenth of the run)")
    k.add_argument("--period-s", type=float, help="seconds between the starts of a client's rounds (default: a "
                                                  "minute, or the recording's length and 10 s if longer)")
    k.add_argument("--url", help="a running app (default: launch one)")
    k.add_argument("--pid", type=int, help="the running app's process id, for RSS and fd figures")
    k.add_argument("--out", default="bench-out")
    q = sub.add_parser("quant", help="compute types x offline models: WER, CER, RTFx, memory")
    q.add_argument("--audio", help="a manifest of real clips (default: tests/data/manifest.tsv when present)")
    q.add_argument("--vllm", default="base", help="models for the vLLM KV-cache rows (model dtype vs fp8), "
                                                  "comma-separated (tiny.en, base); empty for none")
    q.add_argument("--out", default="bench-out")
    from .denoise import add_parser as add_denoise_parser
    from .gpu import add_parser as add_gpu_parser
    from .history import add_parser as add_history_parser
    from .peers import add_parser as add_peers_parser
    from .pool import add_parser as add_pool_parser
    from .retranscribe import add_parser as add_retranscribe_parser
    from .speakers import add_parser as add_speakers_parser
    from .turns import add_parser as add_turns_parser
    from .vocabulary import add_parser as add_vocabulary_parser

    add_peers_parser(sub)
    add_pool_parser(sub)
    add_gpu_parser(sub)
    add_speakers_parser(sub)
    add_history_parser(sub)
    add_retranscribe_parser(sub)
    add_denoise_parser(sub)
    add_turns_parser(sub)
    add_vocabulary_parser(sub)
    one = sub.add_parser("quant-one")
    one.add_argument("model")
    one.add_argument("compute_type")
    one.add_argument("clips")
    args = parser.parse_args(argv)
    if args.kind == "file" and args.random:
        from .compilations import bench_random, lost_anywhere

        return 1 if lost_anywhere(bench_random(args)) else 0
    if args.kind == "file":
        bench_file(args)
    elif args.kind == "stream":
        bench_stream(args)
    elif args.kind == "quant":
        bench_quant(args)
    elif args.kind == "pool":
        from .pool import bench_pool

        doc = bench_pool(args)
        return 0 if doc["summary"]["lost_segments"] == 0 and doc["summary"]["back_down"] else 1
    elif args.kind == "gpu":
        from .gpu import bench_gpu

        return bench_gpu(args)
    elif args.kind == "peers":
        from .peers import bench_peers

        bench_peers(args)
    elif args.kind == "speakers":
        from .speakers import bench_speakers

        bench_speakers(args)
    elif args.kind == "history":
        from .history import bench_history

        bench_history(args)
    elif args.kind == "vocabulary":
        from .vocabulary import bench_vocabulary

        bench_vocabulary(args)
    elif args.kind == "turns":
        from .turns import bench_turns

        bench_turns(args)
    elif args.kind == "denoise":
        from .denoise import bench_denoise

        bench_denoise(args)
    elif args.kind == "retranscribe":
        from .retranscribe import bench_retranscribe

        bench_retranscribe(args)
    elif args.kind == "soak":
        doc = bench_soak(args)
        return 0 if doc["summary"]["verdict"]["nothing_lost"] else 1
    else:
        print(json.dumps(_quant_one(args.model, args.compute_type, Path(args.clips))))
    return 0
