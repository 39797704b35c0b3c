"""Settings: one dataclass, every field a command-line flag and an environment variable.

`python app.py --help` lists them all. The environment variable of a field is `REALTIME_<NAME>`
(upper case), and a flag given on the command line wins over the environment.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .vad import VADConfig


def _opt(help: str, env: str | None = None, **kw: Any) -> Any:
    default = kw.pop("default")
    return field(default=default, metadata={"help": help, "env": env, **kw})


@dataclass
class Settings:
    host: str = _opt("address to listen on", default="127.0.0.1")
    port: int = _opt("port to listen on", default=7860)
    engine: str = _opt("transcription engine: embedded", default="embedded")
    model: str | None = _opt(
        "embedded engine model: empty for the bundled tiny.en, a faster-whisper size name (small.en), "
        "a hub id or a local CTranslate2 directory",
        default=None,
    )
    compute_type: str = _opt("CTranslate2 compute type (int8, int8_float32, int16, float32, float16)", default="int8")
    device: str = _opt("device for the embedded engine (cpu, cuda, auto)", default="cpu")
    cpu_threads: int = _opt("threads for the embedded engine (0: all cores)", default=0)
    beam_size: int = _opt("beam size for final transcripts (partials are greedy)", default=1)
    language: str | None = _opt("language code; empty to detect (English-only models use English)", default=None)
    vad_threshold: float = _opt("speech probability that starts a segment", default=VADConfig.threshold)
    vad_neg_threshold: float = _opt("lower probability under which silence is counted", default=VADConfig.neg_threshold)
    vad_min_speech_ms: int = _opt("shortest speech kept as a segment (ms)", default=VADConfig.min_speech_ms)
    vad_min_silence_ms: int = _opt("silence that closes a segment (ms)", default=VADConfig.min_silence_ms)
    vad_pad_before_ms: int = _opt("audio kept before speech starts (ms)", default=VADConfig.pad_before_ms)
    vad_pad_after_ms: int = _opt("audio kept after speech ends (ms)", default=VADConfig.pad_after_ms)
    max_segment_s: float = _opt("longest segment; longer speech is split at its quietest point (s)",
                                default=VADConfig.max_segment_s)
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
    log_level: str = _opt("logging level", default="INFO")

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

    def ice_servers(self) -> list[dict[str, Any]]:
        servers: list[dict[str, Any]] = []
        stun = [u.strip() for u in self.stun_urls.split(",") if u.strip()]
        if stun:
            servers.append({"urls": stun})
        turn = [u.strip() for u in self.turn_url.split(",") if u.strip()]
        if turn:
            servers.append({"urls": turn, "username": self.turn_username, "credential": self.turn_credential})
        return servers


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
    environ = dict(os.environ) if environ is None else environ
    values: dict[str, Any] = {}
    for f in dataclasses.fields(Settings):
        given = getattr(ns, f.name, None)
        if given is not None:
            values[f.name] = given if isinstance(given, bool) else _convert(f, str(given))
        elif env_name(f.name) in environ:
            values[f.name] = _convert(f, environ[env_name(f.name)])
    settings = Settings(**values)
    settings.vad_config()  # validates
    return settings


def parse_settings(argv: Sequence[str] | None = None, prog: str = "app.py") -> Settings:
    parser = argparse.ArgumentParser(prog=prog, description="Real-time speech transcription in the browser.")
    add_arguments(parser)
    return from_namespace(parser.parse_args(argv))
