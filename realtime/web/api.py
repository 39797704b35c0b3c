"""The app's own transcription API, compatible with OpenAI, `vllm serve` and Hugging Face Whisper endpoints.

This module owns the HTTP transcription routes served next to the page (same process, same engine):

- `POST /v1/audio/transcriptions` and `POST /api/v1/audio/transcriptions` (Hugging Face's route),
  `POST /v1/audio/translations` (and `/api/v1/audio/translations`): a multipart `file` (wav, flac, mp3,
  ogg/opus, webm, m4a: anything PyAV decodes, any rate or channel count), or the raw audio as the body
  (`Content-Type: audio/*` or `application/octet-stream`, fields in the query string). Fields `model`,
  `language`, `prompt`, `temperature`, `response_format` (`json`, `text`, `verbose_json`, `srt`, `vtt`),
  `timestamp_granularities[]` (`segment`, `word`: `verbose_json` then has OpenAI's `words`, on engines that
  declare word timestamps), `max_line_chars` (srt/vtt cues cut at word times to at most that many characters;
  our extension) and `stream` (`true`: Server-Sent Events `transcript.text.delta` /
  `transcript.text.done`, as OpenAI sends them). `verbose_json` gives each segment the language detected in
  it (`language`); a language the model does not speak (any but English on an English-only model) is refused.
- `GET /v1/models`: the model served.

The upload goes to a temporary file while it is read (never whole in memory; `--max-upload-mb` is checked
against Content-Length first and enforced while reading). The file is decoded as a stream, cut with the live
pipeline's VAD in a thread, and the segments join the shared worker's file lane in batches, in order
(realtime/live/transcribe.py, realtime/live/worker.py): live sessions' finals go first. Errors use OpenAI's shape
`{"error": {"message", "type", "code"}}`: 400 undecodable or empty audio, 401 missing or wrong key
(`--api-key`), 405 wrong method (with `Allow`), 413 too large, 415 not audio, 422 bad field, 503 with
Retry-After when the engine is not ready, unavailable or too busy (`--api-max-requests`); 400 also for what the
engine cannot do (translation or another language on an English-only model, word timestamps on an engine without).
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import json
import logging
import math
import re
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from python_multipart.exceptions import FormParserError
from starlette.background import BackgroundTask
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import ClientDisconnect

from ..audio import SAMPLE_RATE, AudioDecodeError, decode_file
from ..engines import EngineUnavailable, TranscribeOptions, Transcription
from ..engines.base import unsupported_language, unsupported_translation
from ..engines.types import APP_OWNER, CLIP_HEADER, LANE_HEADER, Word
from ..live import coverage
from ..live import transcript as fmt
from ..live.service import TranscriptionService
from ..live.transcribe import SegmentStream, Window, stream_text, timed_entries, transcribe_results, window_parts
from ..live.transcript import Entry
from ..live.vad import SegmentEnd
from ..live.worker import Job
from .access import bearer, is_key

log = logging.getLogger(__name__)

RESPONSE_FORMATS = ("json", "text", "verbose_json", "srt", "vtt")
TIMED_FORMATS = ("verbose_json", "srt", "vtt")
GRANULARITIES = ("segment", "word")
RAW_TYPES = ("audio/", "video/", "application/octet-stream")
NOT_AUDIO_TYPES = ("text/", "image/", "application/json", "application/pdf", "application/zip",
                   "application/xml")
_LANGUAGE = re.compile(r"^[a-z]{2,3}$")
_SUFFIX = re.compile(r"^\.[a-z0-9]{1,5}$")
MAX_PROMPT_CHARS = 4000
CLIP_MAX_S = 60.0
"""Longest upload decoded whole for another instance (CLIP_HEADER); a longer one takes the usual path."""
MIN_LINE_CHARS, MAX_LINE_CHARS = 10, 200


def line_chars(raw: str | None, fmt_: str, formats: str) -> int | None:
    """`max_line_chars` (srt/vtt cues cut at word times), or None when not given; 422 for a bad number or for a
    format other than srt and vtt (`formats` names them as the route spells them)."""
    raw = (raw or "").strip()
    if not raw:
        return None
    if not raw.isdigit() or not MIN_LINE_CHARS <= int(raw) <= MAX_LINE_CHARS:
        raise APIError(422, f"max_line_chars must be a whole number from {MIN_LINE_CHARS} to {MAX_LINE_CHARS} "
                            f"(got {raw!r})", "invalid_max_line_chars")
    if fmt_ not in ("srt", "vtt"):
        raise APIError(422, f"max_line_chars works with {formats}", "invalid_max_line_chars")
    return int(raw)


class APIError(Exception):
    """An error answered in OpenAI's shape."""

    def __init__(self, status: int, message: str, code: str, kind: str = "invalid_request_error",
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.kind = status, message, code, kind
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "code": self.code, "param": None}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


class _TooLarge(MultiPartException):
    """The body passed the size limit while being read (a MultiPartException so the parser closes its files)."""


@dataclass(frozen=True)
class Params:
    response_format: str
    stream: bool
    language: str | None
    prompt: str | None
    temperature: float | None
    model: str | None
    words: bool = False
    """`timestamp_granularities[]` has `word`: verbose_json carries each word's times."""
    max_line_chars: int | None = None
    """srt/vtt cues cut at word boundaries to at most this many characters (from word times)."""


def _unavailable(message: str, retry_after: float, code: str = "engine_unavailable") -> APIError:
    return APIError(503, message, code, kind="server_error",
                    headers={"Retry-After": str(max(1, math.ceil(retry_after)))})


NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
NO_SPACE_RETRY_S = 30


def _no_space(exc: OSError) -> APIError:
    log.warning("no space to spool an upload under %s: %s", tempfile.gettempdir(), exc.strerror or exc)
    return APIError(507, "the server has no disk space left to receive the upload; retry later or send a smaller "
                         "file", "insufficient_storage", kind="server_error",
                    headers={"Retry-After": str(NO_SPACE_RETRY_S)})


def _parse_params(fields: dict[str, str]) -> Params:
    fmt_ = (fields.get("response_format") or "json").strip().lower()
    if fmt_ not in RESPONSE_FORMATS:
        raise APIError(422, f"response_format must be one of {', '.join(RESPONSE_FORMATS)} (got {fmt_!r})",
                       "invalid_response_format")
    raw_stream = (fields.get("stream") or "false").strip().lower()
    if raw_stream not in ("true", "false", "1", "0"):
        raise APIError(422, f"stream must be true or false (got {raw_stream!r})", "invalid_stream")
    stream = raw_stream in ("true", "1")
    if stream and fmt_ not in ("json", "text"):
        raise APIError(422, "stream=true works with response_format json or text", "invalid_stream")
    language = (fields.get("language") or "").strip().lower() or None
    if language is not None and not _LANGUAGE.match(language):
        raise APIError(422, f"language must be an ISO-639-1 code such as 'en' (got {language!r})",
                       "invalid_language")
    prompt = fields.get("prompt") or None
    if prompt is not None and len(prompt) > MAX_PROMPT_CHARS:
        raise APIError(422, f"prompt is longer than {MAX_PROMPT_CHARS} characters", "invalid_prompt")
    temperature: float | None = None
    raw_t = (fields.get("temperature") or "").strip()
    if raw_t:
        try:
            temperature = float(raw_t)
        except ValueError:
            raise APIError(422, f"temperature must be a number between 0 and 1 (got {raw_t!r})",
                           "invalid_temperature") from None
        if not 0.0 <= temperature <= 1.0:
            raise APIError(422, f"temperature must be between 0 and 1 (got {temperature})", "invalid_temperature")
        if temperature == 0.0:
            temperature = None  # OpenAI's 0: greedy, raised automatically when the decode looks wrong
    raw_g = ",".join(v for k in ("timestamp_granularities[]", "timestamp_granularities") if (v := fields.get(k)))
    granularities = {g for g in re.split(r"[\s,\[\]\"']+", raw_g.lower()) if g}  # word / word,segment / ["word"]
    if granularities - set(GRANULARITIES):
        raise APIError(422, f"timestamp_granularities[] takes {' and '.join(GRANULARITIES)} "
                            f"(got {', '.join(sorted(granularities - set(GRANULARITIES)))})",
                       "invalid_timestamp_granularities")
    if granularities and fmt_ != "verbose_json":
        raise APIError(422, "timestamp_granularities[] needs response_format=verbose_json",
                       "invalid_timestamp_granularities")
    model = (fields.get("model") or "").strip() or None
    if model is not None and len(model) > 256:
        raise APIError(422, "model name too long", "invalid_model")
    max_line = line_chars(fields.get("max_line_chars"), fmt_, "response_format srt or vtt")
    return Params(fmt_, stream, language, prompt, temperature, model,
                  words="word" in granularities or max_line is not None, max_line_chars=max_line)


def _file_words(end: SegmentEnd, words: tuple[Word, ...]) -> tuple[Word, ...]:
    """Words of a segment's or window's result in the file's time."""
    out = []
    for w in words:
        if isinstance(end, Window):
            start, stop = end.stream_time(w.start), end.stream_time(w.end, end=True)
        else:
            start, stop = end.audio_start + w.start, end.audio_start + w.end
        out.append(Word(round(start, 3), round(max(stop, start), 3), w.word, w.probability))
    return tuple(out)


def _with_words(end: SegmentEnd, result: Transcription, entries: list[Entry]) -> list[Entry]:
    """The entries of a result with its language and their words in the file's time (an entry per timed piece,
    or one for the whole result: `timed_entries`)."""
    pieces = [s for s in result.segments if s.text] if result.text else []
    groups = [p.words for p in pieces] if len(pieces) == len(entries) else [result.words] * (len(entries) == 1)
    if len(groups) != len(entries):
        return [dataclasses.replace(e, language=result.language) for e in entries]
    return [dataclasses.replace(e, language=result.language, words=_file_words(end, g))
            for e, g in zip(entries, groups, strict=True)]


def _check_audio(path: Path, declared: str) -> None:
    """400 for what does not decode, 415 for files that are not audio (another kind, or no audio stream)."""
    import av

    if path.stat().st_size == 0:
        raise APIError(400, "the audio file is empty", "empty_file")
    not_audio = declared.startswith(NOT_AUDIO_TYPES)
    try:
        container = av.open(str(path))
    except Exception as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        reason = re.sub(r":\s*'[^']*'$", "", reason.replace(str(path), "upload"))  # no server paths in replies
        if not_audio:
            raise APIError(415, f"unsupported file type {declared}: send wav, flac, mp3, ogg, webm or m4a audio",
                           "unsupported_media_type") from None
        raise APIError(400, f"the file is not decodable audio ({reason})", "invalid_audio") from None
    with container:
        if not container.streams.audio:
            raise APIError(415, f"unsupported format: the {container.format.name} file contains no audio stream",
                           "unsupported_media_type")


def _clean(exc: BaseException, path: Path) -> str:
    """An error's text without the server's temporary paths."""
    return str(exc).replace(f"{path}: ", "").replace(str(path), "upload")


def _suffix(filename: str | None) -> str:
    suffix = Path(filename or "").suffix.lower()
    return suffix if _SUFFIX.match(suffix) else ""


def create_router(service: TranscriptionService, *, lane_hints: bool = False) -> APIRouter:
    """The API routes bound to one TranscriptionService (its settings, engine and worker).

    With `lane_hints`, a request marked as another app's live final (`LANE_HEADER: final`, sent by the remote
    engine) joins the worker's finals lane, ahead of file jobs; the header is ignored otherwise."""
    settings = service.settings
    router = APIRouter()
    limit = int(settings.max_upload_mb * 1024 * 1024)
    running = 0

    def check_key(request: Request) -> None:
        key = settings.api_key
        if not key:
            return
        if not is_key(bearer(request.headers.get("authorization", "")), key):
            raise APIError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'",
                           "invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    def check_ready() -> dict[str, Any]:
        engine = service.engine
        if not service.ready or not engine.ready:
            raise _unavailable(f"the {engine.name} engine is not ready", 5, "engine_not_ready")
        return engine.describe()

    def check_capabilities(params: Params) -> None:
        """400 for what the engine and model cannot do, said plainly."""
        engine = service.engine
        why = unsupported_language(params.language, engine) if params.language is not None else None
        if why is not None:
            raise APIError(400, why, "unsupported_language")
        if params.words and not engine.word_timestamps:
            raise APIError(400, f"the {engine.name} engine cannot give word timestamps (Whisper's word alignment "
                                "needs the model's cross-attention, which it does not return); leave out "
                                "timestamp_granularities[]=word and max_line_chars, or run the embedded engine",
                           "word_timestamps_unsupported")

    async def limited(request: Request) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in request.stream():
            seen += len(chunk)
            if seen > limit:
                raise _TooLarge(f"the upload is larger than {settings.max_upload_mb:g} MB")
            yield chunk

    async def read_upload(request: Request, kind: str, workdir: Path) -> tuple[dict[str, str], Path, str]:
        """(fields, path of the audio file on disk, declared content type)."""
        fields: dict[str, str] = {}

        def add(name: str, value: str) -> None:  # repeated granularities (one part per value) are all kept
            fields[name] = f"{fields[name]},{value}" if name.startswith("timestamp_granularities") and \
                name in fields else value

        for k, v in request.query_params.multi_items():
            add(k, v)
        if kind == "raw":
            declared = request.headers.get("content-type", "")
            path = workdir / "upload"
            with path.open("wb") as out:
                buf = bytearray()
                async for chunk in limited(request):
                    buf += chunk
                    if len(buf) >= 1 << 20:
                        await asyncio.to_thread(out.write, bytes(buf))
                        buf.clear()
                out.write(buf)
            return fields, path, declared
        parser = MultiPartParser(request.headers, limited(request), max_files=4, max_fields=64,
                                 max_part_size=64 * 1024)
        try:
            form = await parser.parse()
        except OSError:  # a full disk under the parser's spill files: it closes them only on its own errors
            for file in getattr(parser, "_files_to_close_on_error", ()):
                file.close()
            raise
        upload: UploadFile | None = None
        try:
            for name, value in form.multi_items():
                if isinstance(value, UploadFile):
                    if name == "file" and upload is None:
                        upload = value
                elif name == "file":
                    raise APIError(422, "file must be sent as a file part (multipart with a filename)",
                                   "invalid_file")
                else:
                    add(name, value)
            if upload is None:
                raise APIError(422, "the multipart field 'file' (the audio) is missing", "missing_file")
            path = workdir / ("upload" + _suffix(upload.filename))
            with path.open("wb") as out:
                await asyncio.to_thread(shutil.copyfileobj, upload.file, out, 1 << 20)
            return fields, path, upload.content_type or ""
        finally:
            await form.close()

    def engine_error(exc: BaseException) -> APIError:
        if isinstance(exc, EngineUnavailable):
            return _unavailable(str(exc), exc.retry_after)
        return APIError(500, f"transcription failed: {exc}", "engine_error", kind="server_error")

    async def results(path: Path, options: TranscribeOptions, segments: SegmentStream,
                      ) -> AsyncIterator[tuple[SegmentEnd, Transcription, list[Entry]]]:
        """(segment or window, its result, its entries) in order."""
        n = 0
        async for end, result in transcribe_results(path, service.file_worker(), options=options, stream=segments):
            if isinstance(result, BaseException):
                raise engine_error(result)
            entries = timed_entries(end, result, n)
            n += len(entries)
            yield end, result, entries

    async def respond(params: Params, task: str, path: Path, options: TranscribeOptions) -> Response:
        # segments are packed into windows; formats with times ask for Whisper's timestamps in them, or go
        # segment by segment on engines that have none
        window = settings.file_window_s or None
        if params.response_format in TIMED_FORMATS:
            options = dataclasses.replace(options, timestamps=True, word_timestamps=params.words)
            window = window if service.engine.timestamps else None
        segments = SegmentStream(path, settings.vad_config(), window_s=window,
                                 max_parts=window_parts(service.engine))
        entries: list[Entry] = []
        verbose: list[dict[str, Any]] = []
        words: list[dict[str, Any]] = []
        language = options.language
        try:
            async for end, result, found in results(path, options, segments):
                language = language or result.language
                for entry in _with_words(end, result, found):
                    words += [{"word": w.word.strip(), "start": w.start, "end": w.end} for w in entry.words]
                    if not entry.text:
                        continue
                    entries.append(entry)
                    verbose.append({
                        "id": len(verbose), "seek": 0, "start": round(entry.start, 3), "end": round(entry.end, 3),
                        "text": entry.text, "tokens": [],
                        "temperature": float(result.extra.get("temperature", options.temperature or 0.0)),
                        "avg_logprob": result.avg_logprob if result.avg_logprob is not None else 0.0,
                        "compression_ratio": 0.0,
                        "no_speech_prob": result.no_speech_prob if result.no_speech_prob is not None else 0.0,
                        "language": result.language or options.language or "en",
                    })
        except AudioDecodeError as exc:
            raise APIError(400, f"the file is not decodable audio ({_clean(exc, path)})", "invalid_audio") from None
        text = " ".join(e.text for e in entries)
        usage = {"type": "duration", "seconds": round(segments.duration, 3)}
        if params.response_format == "json":
            return JSONResponse({"text": text, "usage": usage})
        if params.response_format == "text":
            return PlainTextResponse(text + "\n")
        if params.response_format == "srt":
            return PlainTextResponse(fmt.to_srt(entries, params.max_line_chars))
        if params.response_format == "vtt":
            return PlainTextResponse(fmt.to_vtt(entries, params.max_line_chars), media_type="text/vtt")
        return JSONResponse({"task": task, "language": language or "en", "duration": round(segments.duration, 3),
                             "text": text, "segments": verbose, **({"words": words} if params.words else {}),
                             "usage": usage})

    async def respond_clip(params: Params, task: str, path: Path, options: TranscribeOptions) -> Response:
        """The upload decoded whole, as the file path decodes a packed window to check its coverage (CLIP_HEADER:
        another instance's remote engine sent a window it packed and checks it itself): `verbose_json` with the
        times this engine has, words (with Whisper's leading spaces) where it aligns them, else timed pieces."""
        try:
            audio = await asyncio.to_thread(decode_file, path)
        except AudioDecodeError as exc:
            raise APIError(400, f"the file is not decodable audio ({_clean(exc, path)})", "invalid_audio") from None
        if audio.size > CLIP_MAX_S * SAMPLE_RATE:
            return await respond(params, task, path, options)
        checked = coverage.check_options(service.engine, options)
        job = Job(f"clip-{uuid.uuid4().hex[:12]}", 0, audio, "final" if options.live else "file", checked)
        try:
            result = await service.file_worker().submit(job)
        except Exception as exc:
            raise engine_error(exc) from None
        pieces = [p for p in result.segments if p.text.strip()]
        duration = round(audio.size / SAMPLE_RATE, 3)
        return JSONResponse({
            "task": task, "language": result.language or options.language or "en", "duration": duration,
            "text": result.text.strip(),
            "segments": [{"id": i, "seek": 0, "start": round(p.start, 3), "end": round(p.end, 3),
                          "text": p.text.strip(), "tokens": [],
                          "temperature": float(result.extra.get("temperature", 0.0)),
                          "avg_logprob": result.avg_logprob or 0.0, "compression_ratio": 0.0,
                          "no_speech_prob": result.no_speech_prob or 0.0} for i, p in enumerate(pieces)],
            "words": [{"word": w.word, "start": w.start, "end": w.end} for w in result.words],
            "usage": {"type": "duration", "seconds": duration}})

    async def events(path: Path, options: TranscribeOptions) -> AsyncIterator[str]:
        """OpenAI's streaming events: a delta per piece of text (a streaming engine's own deltas for each segment,
        else the timed pieces of each packed window, once its coverage is checked), then the whole text."""
        engine = service.engine
        texts: list[str] = []

        def event(doc: dict[str, Any]) -> str:
            return f"data: {json.dumps(doc, ensure_ascii=False)}\n\n"

        try:
            # a streaming engine's deltas carry no times to check a packed window by: a window per segment
            segments = SegmentStream(path, settings.vad_config(), window_s=settings.file_window_s or None,
                                     max_parts=1 if engine.streaming else window_parts(engine))
            if engine.streaming:
                async for end in segments:
                    parts: list[str] = []
                    try:
                        async for delta in stream_text(service.file_worker(), end.heard, options):
                            if not parts:
                                delta = delta.lstrip()
                                if not delta:
                                    continue
                                if texts:
                                    delta = " " + delta
                            parts.append(delta)
                            yield event({"type": "transcript.text.delta", "delta": delta})
                    except Exception as exc:
                        raise engine_error(exc) from None
                    if "".join(parts).strip():
                        texts.append("".join(parts).strip())
            else:  # a delta per timed piece of each window where the engine gives Whisper's timestamps
                if engine.timestamps:
                    options = dataclasses.replace(options, timestamps=True)
                async for _, _, found in results(path, options, segments):
                    for entry in found:
                        if entry.text:
                            yield event({"type": "transcript.text.delta",
                                         "delta": (" " if texts else "") + entry.text})
                            texts.append(entry.text)
            yield event({"type": "transcript.text.done", "text": " ".join(texts)})
        except AudioDecodeError as exc:
            yield event(APIError(400, f"the file is not decodable audio ({_clean(exc, path)})",
                                 "invalid_audio").body())
        except APIError as exc:
            yield event(exc.body())
        except Exception as exc:
            log.exception("API stream failed")
            yield event(APIError(500, f"transcription failed: {type(exc).__name__}", "internal_error",
                                 kind="server_error").body())

    async def handle(request: Request, task: str) -> Response:
        nonlocal running
        check_key(request)
        check_ready()
        if task == "translate" and (why := unsupported_translation(service.engine)) is not None:
            raise APIError(400, why, "translation_unsupported")
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise APIError(413, f"the upload ({int(length) / 1e6:.0f} MB) is larger than the limit of "
                                f"{settings.max_upload_mb:g} MB", "file_too_large")
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype == "multipart/form-data":
            kind = "form"
        elif not ctype or ctype.startswith(RAW_TYPES):
            kind = "raw"
        elif ctype == "application/x-www-form-urlencoded":
            raise APIError(422, "the multipart field 'file' (the audio) is missing: send multipart/form-data",
                           "missing_file")
        else:
            raise APIError(415, f"unsupported content type {ctype!r}: send multipart/form-data with a 'file' "
                                "field, or the audio itself as the body", "unsupported_media_type")
        if settings.api_max_requests and running >= settings.api_max_requests:
            raise _unavailable(f"the server is busy ({running} transcriptions running); retry shortly", 2,
                               "overloaded")
        try:
            workdir = Path(tempfile.mkdtemp(prefix="realtime-api-"))
        except OSError as exc:
            if exc.errno in NO_SPACE:
                raise _no_space(exc) from None
            raise
        running += 1
        handed_over = False
        try:
            try:
                fields, path, declared = await read_upload(request, kind, workdir)
            except _TooLarge as exc:
                raise APIError(413, str(exc), "file_too_large") from None
            except MultiPartException as exc:
                raise APIError(400, f"malformed multipart body: {exc.message}", "invalid_multipart") from None
            except FormParserError as exc:  # what python-multipart raises past Starlette's parser (a bad part header)
                raise APIError(400, f"malformed multipart body: {exc}", "invalid_multipart") from None
            except OSError as exc:  # the disk filled while the upload was written (the parser's spill or ours)
                if exc.errno in NO_SPACE:
                    raise _no_space(exc) from None
                raise
            params = _parse_params(fields)
            check_capabilities(params)
            await asyncio.to_thread(_check_audio, path, declared)
            live = lane_hints and request.headers.get(LANE_HEADER, "").strip().lower() == "final"
            options = TranscribeOptions(language=params.language, task=task,  # type: ignore[arg-type]
                                        prompt=params.prompt, temperature=params.temperature, live=live)
            if not params.stream:
                if params.response_format == "verbose_json" and \
                        request.headers.get(CLIP_HEADER, "").strip().lower() == "checked":
                    return await respond_clip(params, task, path, options)
                return await respond(params, task, path, options)

            released = False

            def release() -> None:  # from the stream's end, or after the response if the stream never ran
                nonlocal running, released
                if not released:
                    released = True
                    running -= 1
                    shutil.rmtree(workdir, ignore_errors=True)

            async def stream() -> AsyncIterator[str]:
                try:
                    async for chunk in events(path, options):
                        yield chunk
                finally:
                    release()

            handed_over = True
            return StreamingResponse(stream(), media_type="text/event-stream", background=BackgroundTask(release),
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        finally:
            if not handed_over:
                running -= 1
                shutil.rmtree(workdir, ignore_errors=True)

    async def guarded(request: Request, task: str) -> Response:
        try:
            return await handle(request, task)
        except APIError as exc:
            return exc.response()
        except ClientDisconnect:
            return APIError(400, "the client disconnected during the upload", "client_disconnected").response()
        except Exception:
            log.exception("API request failed")
            return APIError(500, "internal error", "internal_error", kind="server_error").response()

    @router.post("/v1/audio/transcriptions", include_in_schema=False)
    @router.post("/api/v1/audio/transcriptions", include_in_schema=False)
    async def transcriptions(request: Request) -> Response:
        return await guarded(request, "transcribe")

    @router.post("/v1/audio/translations", include_in_schema=False)
    @router.post("/api/v1/audio/translations", include_in_schema=False)
    async def translations(request: Request) -> Response:
        return await guarded(request, "translate")

    @router.get("/v1/models", include_in_schema=False)
    async def models(request: Request) -> Response:
        try:
            check_key(request)
        except APIError as exc:
            return exc.response()
        info = service.engine.describe()
        return JSONResponse({"object": "list", "data": [{
            "id": str(info.get("model")), "object": "model", "created": int(service.started_at),
            "owned_by": APP_OWNER, "engine": info.get("engine"), "ready": service.engine.ready,
        }]})

    # Another method on these routes would fall through to the page's catch-all mount (a 404 in another
    # shape): answer 405 in OpenAI's shape, with the methods that are allowed.
    def wrong_method(allowed: str) -> Callable[[Request], Awaitable[Response]]:
        async def refuse(request: Request) -> Response:
            return APIError(405, f"{request.method} is not allowed on {request.url.path}; use {allowed}",
                            "method_not_allowed", headers={"Allow": allowed}).response()

        return refuse

    for path in ("/v1/audio/transcriptions", "/api/v1/audio/transcriptions", "/v1/audio/translations",
                 "/api/v1/audio/translations"):
        router.add_api_route(path, wrong_method("POST"), methods=["GET", "HEAD", "PUT", "PATCH", "DELETE", "OPTIONS"],
                             include_in_schema=False)
    router.add_api_route("/v1/models", wrong_method("GET"), methods=["POST", "PUT", "PATCH", "DELETE", "OPTIONS"],
                         include_in_schema=False)
    return router


__all__ = ["APIError", "create_router"]
