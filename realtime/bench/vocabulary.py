"""`python -m realtime bench vocabulary`: a session vocabulary on real clips with rare names, with and without it.

The manifest's clips that hold rare names (`NAMES`, by clip) are read by the app's file path (the HTTP API's) with no
vocabulary and with the list of every name; the other clips with the same list, so that a name the model now
prefers, said nowhere in them, shows as WER. Per model: the names read right (each name's words, in order, in the
clip's text), the WER of the named clips and of the others, with and without the list.
"""

from __future__ import annotations

import argparse
import asyncio
import re
from pathlib import Path
from typing import Any

from .common import ROOT, _machine, write_outputs
from .corpus import corpus_wer, read_manifest

NAMES: dict[str, tuple[str, ...]] = {
    "librispeech-1272-128104-0004-8k": ("Linnell", "Birket Foster", "Carker", "John Collier"),
    "ami-ES2011a-headset0-41s": ("Abigail Claflin", "Abbie"),
    "librivox-sense-and-sensibility-01-0870": ("John Dashwood",),
    "librispeech-1272-128104-0000": ("Quilter",),
    "ljspeech-LJ001-0007": ("Gutenberg",),
}
"""The rare names that the manifest's clips hold, as their references spell them."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("vocabulary", help="a session vocabulary on real clips with rare names, with and without")
    p.add_argument("--audio", default=str(ROOT / "tests" / "data" / "manifest.tsv"))
    p.add_argument("--models", default="tiny.en,base", help="tiny.en (bundled) and/or base (from its packages)")
    p.add_argument("--out", default="bench-out")


def _words(text: str) -> list[str]:
    return re.sub(r"'s\b", "", re.sub(r"[^\w' ]+", " ", text.lower())).split()


def said(name: str, text: str) -> bool:
    """Whether `text` holds `name`'s words, in order, side by side (case, punctuation and a possessive aside)."""
    want, have = _words(name), _words(text)
    return any(have[i:i + len(want)] == want for i in range(len(have) - len(want) + 1))


def _engine(model: str) -> Any:
    from ..engines.embedded import EmbeddedEngine

    engine = EmbeddedEngine(None if model == "tiny.en" else model,
                            compute_type="int8" if model == "tiny.en" else "float32", language="en")
    engine.load()
    return engine


def read(path: Path, engine: Any, options: Any) -> str:
    """The app's file path on one clip (VAD, windows, the coverage check), as the HTTP API reads an upload."""
    from ..config import WINDOW_S
    from ..live.transcribe import transcribe_file

    entries = asyncio.run(transcribe_file(path, engine, options=options, window_s=WINDOW_S))
    return " ".join(e.text for e in entries if e.kind == "final")


def bench_vocabulary(args: argparse.Namespace) -> dict[str, Any]:
    from ..engines import TranscribeOptions

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    clips = read_manifest(Path(args.audio), {"short", "read", "spontaneous", "telephone"}, longest=30.0)
    named = [c for c in clips if c.path.stem in NAMES]
    others = [c for c in clips if c.path.stem not in NAMES]
    terms = tuple(n for names in NAMES.values() for n in names)
    rows = []
    for model in [m.strip() for m in args.models.split(",") if m.strip()]:
        engine = _engine(model)
        for with_list in (False, True):
            options = TranscribeOptions(language="en", vocabulary=terms if with_list else ())
            texts = {c.name: read(c.path, engine, options) for c in clips}
            right = [(c.name, n) for c in named for n in NAMES[c.path.stem] if said(n, texts[c.name])]
            rows.append({
                "model": model, "vocabulary": with_list, "names_right": len(right),
                "names": sum(len(NAMES[c.path.stem]) for c in named), "right": right,
                "wer_named": round(corpus_wer([c.text for c in named], [texts[c.name] for c in named]), 4),
                "wer_others": round(corpus_wer([c.text for c in others], [texts[c.name] for c in others]), 4),
                "texts": texts})
            print(f"{model}, vocabulary {'on' if with_list else 'off'}: {len(right)} names right; "
                  f"WER named {100 * rows[-1]['wer_named']:.1f} %, others {100 * rows[-1]['wer_others']:.1f} %",
                  flush=True)
    doc = {"kind": "vocabulary", "machine": _machine(), "terms": list(terms), "named_clips": len(named),
           "other_clips": len(others), "results": rows}
    write_outputs(out, "vocabulary", doc, _table(doc), lambda p: None)
    return doc


def _table(doc: dict[str, Any]) -> str:
    head = (f"A vocabulary of the {len(doc['terms'])} rare names that {doc['named_clips']} real clips hold "
            f"({', '.join(doc['terms'])}), given to the engine for those clips and for the {doc['other_clips']} "
            f"others; {doc['machine']}.\n\n| model | vocabulary | names read right | WER, clips with the names | "
            "WER, the other clips |\n|---|---|---|---|---|\n")
    lines = [f"| {r['model']} | {'on' if r['vocabulary'] else 'off'} | {r['names_right']} of {r['names']} | "
             f"{100 * r['wer_named']:.1f} % | {100 * r['wer_others']:.1f} % |" for r in doc["results"]]
    return head + "\n".join(lines) + "\n"
