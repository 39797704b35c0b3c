"""The app's own transcription API, compatible with OpenAI, `vllm serve` and Hugging Face Whisper endpoints.

This module owns the HTTP transcription routes served next to the page (same process, same engine):

- `POST /v1/audio/transcriptions` and `POST /api/v1/audio/transcriptions` (Hugging Face's route),
  `POST /v1/audio/translations` (and `/api/v1/audio/translations`): a multipart `file` (wav, flac, mp3,
  ogg/opus, webm, m4a: anything PyAV decodes, any rate or channel count), or the raw audio as the body
  (`Content-Type: audio/*` or `application/octet-stream`, fields in the query string). Fields `model`,
  `language`, `prompt`, `temperature`, `response_format` (`json`, `text`, `verbose_json`, `srt`, `vtt`),
  `timestamp_granularities[]` (`segment`, `word`: `verbose_json` then has OpenAI's `words`, on engines that
  declare word timestamps), `max_line_chars` (srt/vtt cues cut at word times to at most that many characters;
  our extension), `stream` (`true`: Server-Sent Events `transcript.text.delta` / `transcript.text.done`, as
  OpenAI sends them) and `include[]` (`logprobs`: json and its stream's events carry each token's log
  probability, on engines that declare them), `store` (`true`: the transcript is kept in the history, its id in
  the `X-Transcript-Id` header; our extension). `verbose_json` gives each segment the language detected in it
  (`language`); a language the model does not speak (any but English on an English-only model) is refused.
  `diarized_json` (OpenAI's `TranscriptionDiarized`) labels who spoke each segment, with `known_speaker_names[]`
  and `known_speaker_references[]` (short clips as data URLs) naming them; `diarize=true` (our extension) puts
  the labels in verbose_json (`speaker`), srt (`A: ` before the text) and vtt (voice tags).
- `GET /v1/models`: the model served.

The fields are parsed and checked in `api_fields`. The upload goes to a temporary file while it is read (never whole
in memory; `--max-upload-mb` is checked against Content-Length first and enforced while reading). The file is
decoded as a stream, cut with the live pipeline's VAD in a thread, and the segments join the shared worker's file
lane in batches, in order (realtime/live/transcribe.py, realtime/live/worker.py): live sessions' finals go first.
Errors use OpenAI's shape `{"error": {"message", "type", "code"}}`: 400 undecodable or empty audio, 401 missing or
wrong key (`--api-key`), 405 wrong method (with `Allow`), 413 too large, 415 not audio, 422 bad field, 503 with
Retry-After when the engine is not ready, unavailable or too busy (`--api-max-requests`); 400 also for what the
engine cannot do (translation or another language on an English-only model, word timestamps on an engine without).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from python_multipart.exceptions import FormParserError
from starlette.background import BackgroundTask
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import ClientDisconnect

from ..audio import SAMPLE_RATE, AudioDecodeError, decode_file
from ..engines import EngineUnavailable, TranscribeOptions, Transcription
from ..engines import logprobs as lp
from ..engines.base import unsupported_language, unsupported_logprobs, unsupported_translation
from ..engines.types import APP_OWNER, CLIP_HEADER, LANE_HEADER
from ..live import coverage, labels
from ..live import transcript as fmt
from ..live.service import TranscriptionService
from ..live.transcribe import SegmentStream, stream_text, timed_entries, transcribe_results, window_parts
from ..live.transcript import Entry
from ..live.vad import SegmentEnd
from ..live.worker import Job
from ..speakers import Diarizer, SpeakersUnavailable
from .access import bearer, is_key
from .api_fields import (
    CLIP_MAX_S,
    NO_SPACE,
    RAW_TYPES,
    TIMED_FORMATS,
    APIError,
    Params,
    TooLarge,
    check_audio,
    key_refused,
    no_space,
    parse_params,
    reference_audio,
    unavailable,
    undecodable,
    upload_suffix,
)

log = logging.getLogger(__name__)

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
        if key and not is_key(bearer(request.headers.get("authorization", "")), key):
            raise key_refused()

    def check_ready() -> dict[str, Any]:
        engine = service.engine
        if not service.ready or not engine.ready:
            raise unavailable(f"the {engine.name} engine is not ready", 5, "engine_not_ready")
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
        if params.logprobs and (why := unsupported_logprobs(engine)):
            raise APIError(400, f"{why}; leave out include[]=logprobs", "logprobs_unsupported")
        if params.store and service.history is None:
            raise APIError(400, "this server keeps no history (started with --no-history, or on a Space without "
                                "persistent storage); leave out store=true", "history_off")

    async def limited(request: Request) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in request.stream():
            seen += len(chunk)
            if seen > limit:
                raise TooLarge(f"the upload is larger than {settings.max_upload_mb:g} MB")
            yield chunk

    async def read_upload(request: Request, kind: str, workdir: Path,
                          ) -> tuple[dict[str, str], dict[str, list[str]], Path, str]:
        """(fields, every value of each field in order, path of the audio file on disk, declared content type)."""
        fields: dict[str, str] = {}
        lists: dict[str, list[str]] = {}

        def add(name: str, value: str) -> None:  # repeated granularities (one part per value) are all kept
            fields[name] = f"{fields[name]},{value}" if name.startswith("timestamp_granularities") and \
                name in fields else value
            lists.setdefault(name, []).append(value)

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
            return fields, lists, path, declared
        # a field may be a known speaker's reference clip as a data URL
        parser = MultiPartParser(request.headers, limited(request), max_files=4, max_fields=64,
                                 max_part_size=4 << 20)
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
            path = workdir / ("upload" + upload_suffix(upload.filename))
            with path.open("wb") as out:
                await asyncio.to_thread(shutil.copyfileobj, upload.file, out, 1 << 20)
            return fields, lists, path, upload.content_type or ""
        finally:
            await form.close()

    def engine_error(exc: BaseException) -> APIError:
        if isinstance(exc, EngineUnavailable):
            return unavailable(str(exc), exc.retry_after)
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

    async def speaker_model(params: Params, path: Path) -> tuple[Diarizer, dict[str, np.ndarray]]:
        """The speaker model and the known speakers' clips, checked before anything is transcribed."""
        try:
            diarizer = await asyncio.to_thread(service.diarizer)
        except SpeakersUnavailable as exc:
            raise APIError(400, f"this server has no speaker model: {exc}", "diarization_unavailable") from None
        references = {name: await asyncio.to_thread(reference_audio, url, path.parent, i)
                      for i, (name, url) in enumerate(params.known_speakers)}
        return diarizer, references

    def tokens(entries: list[Entry]) -> list[dict[str, Any]]:
        """OpenAI's `logprobs` of the entries' text, in order; an entry whose tokens were lost is an error, not an
        answer that leaves them out."""
        if any(e.text and e.logprobs is None for e in entries):
            raise APIError(500, "the log-probabilities of part of the text were lost", "logprobs_lost",
                           kind="server_error")
        return lp.as_json(t for e in entries for t in e.logprobs or ())

    async def respond(params: Params, task: str, path: Path, options: TranscribeOptions) -> Response:
        # segments are packed into windows; formats with times get timed pieces of them (realtime/live/transcribe.py,
        # `decode_options`), or go segment by segment on engines that have no times
        window = settings.file_window_s or None
        if params.response_format in TIMED_FORMATS:
            words = params.words or (params.diarize and service.engine.word_timestamps)
            options = dataclasses.replace(options, timestamps=True, word_timestamps=words)
            window = window if service.engine.timestamps else None
        segments = SegmentStream(path, settings.vad_config(), window_s=window,
                                 max_parts=window_parts(service.engine))
        model = await speaker_model(params, path) if params.diarize else None
        entries: list[Entry] = []
        decoded: dict[int, Transcription] = {}
        words: list[dict[str, Any]] = []
        speech: list[tuple[float, float]] = []
        language = options.language
        try:
            async for end, result, found in results(path, options, segments):
                language = language or result.language
                speech += labels.speech_spans(end, settings.vad_config())
                for entry in found:
                    words += [{"word": w.word.strip(), "start": w.start, "end": w.end} for w in entry.words]
                    if not entry.text:
                        continue
                    entries.append(entry)
                    decoded[entry.segment] = result
        except AudioDecodeError as exc:
            raise undecodable(exc, path) from None
        if model is not None:
            diarizer, references = model
            diarization = await asyncio.to_thread(labels.diarize_file, diarizer, path, speech, references)
            entries = labels.label(entries, diarization)
            if not params.words:
                entries = [dataclasses.replace(e, words=()) for e in entries]
        text = " ".join(e.text for e in entries)
        response = answer(params, task, entries, decoded, words, text, language, segments.duration, options)
        if params.store:
            response.headers["X-Transcript-Id"] = await keep(entries, segments.duration, language, path)
        return response

    async def keep(entries: list[Entry], duration: float, language: str | None, path: Path) -> str:
        history = service.history
        assert history is not None  # checked before the upload was read
        try:
            return await asyncio.to_thread(history.save, "api", entries, duration, language, None, path)
        except Exception as exc:
            raise APIError(503, f"the transcript could not be kept: {exc}", "history_unavailable",
                           kind="server_error") from None

    def answer(params: Params, task: str, entries: list[Entry], decoded: dict[int, Transcription],
               words: list[dict[str, Any]], text: str, language: str | None, duration: float,
               options: TranscribeOptions) -> Response:
        usage = {"type": "duration", "seconds": round(duration, 3)}
        if params.response_format == "diarized_json":
            return JSONResponse({"task": "transcribe", "duration": round(duration, 3), "text": text,
                                 "segments": labels.diarized_segments(entries), "usage": usage})
        if params.response_format == "json":
            return JSONResponse({"text": text, **({"logprobs": tokens(entries)} if options.logprobs else {}),
                                 "usage": usage})
        if params.response_format == "text":
            return PlainTextResponse(text + "\n")
        if params.response_format == "srt":
            return PlainTextResponse(fmt.to_srt(entries, params.max_line_chars))
        if params.response_format == "vtt":
            return PlainTextResponse(fmt.to_vtt(entries, params.max_line_chars), media_type="text/vtt")
        verbose = [{
            "id": i, "seek": 0, "start": round(e.start, 3), "end": round(e.end, 3), "text": e.text, "tokens": [],
            "temperature": float((r := decoded[e.segment]).extra.get("temperature", options.temperature or 0.0)),
            "avg_logprob": r.avg_logprob if r.avg_logprob is not None else 0.0, "compression_ratio": 0.0,
            "no_speech_prob": r.no_speech_prob if r.no_speech_prob is not None else 0.0,
            "language": r.language or options.language or "en", **({"speaker": e.speaker} if e.speaker else {}),
        } for i, e in enumerate(entries)]
        return JSONResponse({"task": task, "language": language or "en", "duration": round(duration, 3),
                             "text": text, "segments": verbose, **({"words": words} if params.words else {}),
                             "usage": usage})

    async def respond_clip(params: Params, task: str, path: Path, options: TranscribeOptions) -> Response:
        """The upload decoded whole, as the file path decodes a packed window to check its coverage (CLIP_HEADER:
        another instance's remote engine sent a window it packed and checks it itself): `verbose_json` with the
        times this engine has, words (with Whisper's leading spaces) where it aligns them, else timed pieces."""
        try:
            audio = await asyncio.to_thread(decode_file, path)
        except AudioDecodeError as exc:
            raise undecodable(exc, path) from None
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
        said: list[dict[str, Any]] = []

        def event(doc: dict[str, Any]) -> str:
            return f"data: {json.dumps(doc, ensure_ascii=False)}\n\n"

        try:
            # a streaming engine's deltas carry no times to check a packed window by: a window per segment
            segments = SegmentStream(path, settings.vad_config(), window_s=settings.file_window_s or None,
                                     max_parts=1 if engine.streaming and not options.logprobs
                                     else window_parts(engine))
            if engine.streaming and not options.logprobs:  # a streaming engine's deltas carry no tokens
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
            else:  # a delta per timed piece of each window where the engine gives times
                if engine.timestamps:
                    options = dataclasses.replace(options, timestamps=True)
                async for _, _, found in results(path, options, segments):
                    for entry in found:
                        if entry.text:
                            scored = {"logprobs": tokens([entry])} if options.logprobs else {}
                            yield event({"type": "transcript.text.delta",
                                         "delta": (" " if texts else "") + entry.text, **scored})
                            texts.append(entry.text)
                            said.extend(scored.get("logprobs", ()))
            yield event({"type": "transcript.text.done", "text": " ".join(texts),
                         **({"logprobs": said} if options.logprobs else {})})
        except AudioDecodeError as exc:
            yield event(undecodable(exc, path).body())
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
            raise unavailable(f"the server is busy ({running} transcriptions running); retry shortly", 2,
                               "overloaded")
        try:
            workdir = Path(tempfile.mkdtemp(prefix="realtime-api-"))
        except OSError as exc:
            if exc.errno in NO_SPACE:
                raise no_space(exc) from None
            raise
        running += 1
        handed_over = False
        try:
            try:
                fields, lists, path, declared = await read_upload(request, kind, workdir)
            except TooLarge as exc:
                raise APIError(413, str(exc), "file_too_large") from None
            except MultiPartException as exc:
                raise APIError(400, f"malformed multipart body: {exc.message}", "invalid_multipart") from None
            except FormParserError as exc:  # what python-multipart raises past Starlette's parser (a bad part header)
                raise APIError(400, f"malformed multipart body: {exc}", "invalid_multipart") from None
            except OSError as exc:  # the disk filled while the upload was written (the parser's spill or ours)
                if exc.errno in NO_SPACE:
                    raise no_space(exc) from None
                raise
            params = parse_params(fields, lists)
            check_capabilities(params)
            await asyncio.to_thread(check_audio, path, declared)
            live = lane_hints and request.headers.get(LANE_HEADER, "").strip().lower() == "final"
            options = TranscribeOptions(language=params.language, task=task,  # type: ignore[arg-type]
                                        prompt=params.prompt, temperature=params.temperature, live=live,
                                        logprobs=params.logprobs,
                                        vocabulary=settings.vocabulary_terms if params.vocabulary is None
                                        else params.vocabulary)
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
