"""The transcription API's request: its fields parsed and checked into `Params`, the upload checked as audio, the
known speakers' reference clips decoded, and errors in OpenAI's shape (`APIError`)."""

from __future__ import annotations

import base64
import binascii
import errno
import logging
import math
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from fastapi.responses import JSONResponse
from starlette.formparsers import MultiPartException

from ..audio import SAMPLE_RATE, AudioDecodeError, decode_file
from ..config import vocabulary_of

log = logging.getLogger(__name__)

RESPONSE_FORMATS = ("json", "text", "verbose_json", "srt", "vtt", "diarized_json")
TIMED_FORMATS = ("verbose_json", "srt", "vtt", "diarized_json")
INCLUDE = ("logprobs",)
"""What `include[]` may ask for (OpenAI's `TranscriptionInclude`)."""
MAX_KNOWN_SPEAKERS = 4
REFERENCE_S = (2.0, 10.0)
"""A known speaker's reference clip is this long (OpenAI's bounds), give or take `REFERENCE_SLACK_S`."""
REFERENCE_SLACK_S = 0.25
_DATA_URL = re.compile(r"^data:(?P<type>[\w./+-]*)(?:;[\w=.-]+)*;base64,(?P<data>.*)$", re.DOTALL)
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


def key_refused() -> APIError:
    """401 for a request without the `--api-key` it needs."""
    return APIError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'", "invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"})


def token_refused() -> APIError:
    """401 for a session's transcript asked without the key or the session's token (realtime/web/access.py)."""
    return APIError(401, "this transcript needs the API key (Authorization: Bearer) or its session's token "
                         "(?token=)", "invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


class TooLarge(MultiPartException):
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
    diarize: bool = False
    """Speaker labels: `diarized_json`, or `diarize=true` with verbose_json, srt or vtt (our extension)."""
    known_speakers: tuple[tuple[str, str], ...] = ()
    """(name, reference clip as a data URL) from `known_speaker_names[]` and `known_speaker_references[]`."""
    logprobs: bool = False
    """`include[]` has `logprobs`: json (and its stream's events) carry each token's log probability."""
    store: bool = False
    """`store=true`: the transcript is kept in the history (its id in the `X-Transcript-Id` header)."""
    vocabulary: tuple[str, ...] | None = None
    """`vocabulary` (comma-separated) or `vocabulary[]` (our extension): terms the speech may hold; None: the app's
    `--vocabulary`."""


def unavailable(message: str, retry_after: float, code: str = "engine_unavailable") -> APIError:
    return APIError(503, message, code, kind="server_error",
                    headers={"Retry-After": str(max(1, math.ceil(retry_after)))})


NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
NO_SPACE_RETRY_S = 30


def no_space(exc: OSError) -> APIError:
    log.warning("no space to spool an upload under %s: %s", tempfile.gettempdir(), exc.strerror or exc)
    return APIError(507, "the server has no disk space left to receive the upload; retry later or send a smaller "
                         "file", "insufficient_storage", kind="server_error",
                    headers={"Retry-After": str(NO_SPACE_RETRY_S)})


def _parse_speakers(fmt_: str, fields: dict[str, str], lists: dict[str, list[str]],
                    ) -> tuple[bool, tuple[tuple[str, str], ...]]:
    raw = (fields.get("diarize") or "false").strip().lower()
    if raw not in ("true", "false", "1", "0"):
        raise APIError(422, f"diarize must be true or false (got {raw!r})", "invalid_diarize")
    diarize = fmt_ == "diarized_json" or raw in ("true", "1")
    if diarize and fmt_ not in TIMED_FORMATS:
        raise APIError(422, "speaker labels need response_format diarized_json (or verbose_json, srt or vtt with "
                            "diarize=true)", "invalid_diarize")
    names = [n.strip() for k in ("known_speaker_names[]", "known_speaker_names") for n in lists.get(k, [])]
    refs = [r.strip() for k in ("known_speaker_references[]", "known_speaker_references") for r in lists.get(k, [])]
    if not names and not refs:
        return diarize, ()
    if not diarize:
        raise APIError(422, "known_speaker_names[] need response_format=diarized_json", "invalid_known_speakers")
    if len(names) != len(refs):
        raise APIError(422, f"known_speaker_names[] ({len(names)}) and known_speaker_references[] ({len(refs)}) "
                            "must pair up", "invalid_known_speakers")
    if len(names) > MAX_KNOWN_SPEAKERS:
        raise APIError(422, f"at most {MAX_KNOWN_SPEAKERS} known speakers", "invalid_known_speakers")
    if any(not n or len(n) > 64 for n in names) or len(set(names)) != len(names):
        raise APIError(422, "known_speaker_names[] must be distinct, non-empty and at most 64 characters",
                       "invalid_known_speakers")
    if any(not _DATA_URL.match(r) for r in refs):
        raise APIError(422, "known_speaker_references[] must be data URLs (data:audio/wav;base64,...)",
                       "invalid_known_speakers")
    return diarize, tuple(zip(names, refs, strict=True))


def reference_audio(url: str, workdir: Path, i: int) -> np.ndarray:
    """A known speaker's reference clip, decoded and its length checked (in a thread)."""
    match = _DATA_URL.match(url)
    assert match is not None
    try:
        data = base64.b64decode(match["data"], validate=False)
    except (binascii.Error, ValueError):
        raise APIError(400, f"known_speaker_references[{i}] is not valid base64", "invalid_speaker_reference") \
            from None
    path = workdir / f"reference-{i}"
    path.write_bytes(data)
    try:
        audio = decode_file(path)
    except AudioDecodeError as exc:
        raise APIError(400, f"known_speaker_references[{i}] is not decodable audio ({clean_error(exc, path)})",
                       "invalid_speaker_reference") from None
    seconds = audio.size / SAMPLE_RATE
    low, high = REFERENCE_S
    if not low - REFERENCE_SLACK_S <= seconds <= high + REFERENCE_SLACK_S:
        raise APIError(400, f"known_speaker_references[{i}] is {seconds:.1f} s long; a reference clip is "
                            f"{low:g} to {high:g} s of the speaker alone", "invalid_speaker_reference")
    return audio


def parse_params(fields: dict[str, str], lists: dict[str, list[str]] | None = None) -> Params:
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
    raw_store = (fields.get("store") or "false").strip().lower()
    if raw_store not in ("true", "false", "1", "0"):
        raise APIError(422, f"store must be true or false (got {raw_store!r})", "invalid_store")
    store = raw_store in ("true", "1")
    if store and stream:
        raise APIError(422, "store=true needs the whole answer at once; leave out stream=true", "invalid_store")
    language = (fields.get("language") or "").strip().lower() or None
    if language is not None and not _LANGUAGE.match(language):
        raise APIError(422, f"language must be an ISO-639-1 code such as 'en' (got {language!r})",
                       "invalid_language")
    prompt = fields.get("prompt") or None
    if prompt is not None and len(prompt) > MAX_PROMPT_CHARS:
        raise APIError(422, f"prompt is longer than {MAX_PROMPT_CHARS} characters", "invalid_prompt")
    vocabulary = None
    given = [v for k in ("vocabulary[]", "vocabulary") for v in (lists or {}).get(k, [fields.get(k) or ""]) if v]
    if given:
        try:
            vocabulary = vocabulary_of(given)
        except ValueError as exc:
            raise APIError(422, str(exc), "invalid_vocabulary") from None
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
    diarize, known = _parse_speakers(fmt_, fields, lists or {})
    include = {v.strip() for k in ("include[]", "include") for v in (lists or {}).get(k, [])} - {""}
    if include - set(INCLUDE):
        raise APIError(422, f"include[] takes {', '.join(INCLUDE)} (got {', '.join(sorted(include - set(INCLUDE)))})",
                       "invalid_include")
    if include and fmt_ != "json":
        raise APIError(422, "include[]=logprobs needs response_format=json", "invalid_include")
    return Params(fmt_, stream, language, prompt, temperature, model,
                  words="word" in granularities or max_line is not None, max_line_chars=max_line,
                  diarize=diarize, known_speakers=known, logprobs="logprobs" in include, store=store,
                  vocabulary=vocabulary)


def check_audio(path: Path, declared: str) -> None:
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


def clean_error(exc: BaseException, path: Path) -> str:
    """An error's text without the server's temporary paths."""
    return str(exc).replace(f"{path}: ", "").replace(str(path), "upload")


def undecodable(exc: AudioDecodeError, path: Path) -> APIError:
    return APIError(400, f"the file is not decodable audio ({clean_error(exc, path)})", "invalid_audio")


def upload_suffix(filename: str | None) -> str:
    suffix = Path(filename or "").suffix.lower()
    return suffix if _SUFFIX.match(suffix) else ""
