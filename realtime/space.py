"""Hugging Face Spaces: the one place where the Space's environment variables become the app's settings.

This module is the only reader of secrets from the environment. A Space hands the app its variables and
secrets as environment variables under their usual names
(`HF_TOKEN`, `ENDPOINT_URL`, ...), and Gradio Spaces set `GRADIO_SERVER_NAME` / `GRADIO_SERVER_PORT`.
`space_environ()` copies each of them onto the `REALTIME_<NAME>` variable of its setting (an explicit
`REALTIME_<NAME>` wins), and when `SPACE_ID` is set it fills in the defaults of a public demo on a free
CPU Space: listen on all interfaces, require a TURN relay, and limit sessions. `config.from_namespace`
calls it, so a local `python app.py` with the same variables behaves exactly as the Space does.
"""

from __future__ import annotations

from collections.abc import Mapping

# Space (and Gradio) variable -> the REALTIME_ variable of the setting it feeds.
ENV_ALIASES: dict[str, str] = {
    "SPACE_ID": "REALTIME_SPACE_ID",
    "GRADIO_SERVER_NAME": "REALTIME_HOST",
    "GRADIO_SERVER_PORT": "REALTIME_PORT",
    "HF_TOKEN": "REALTIME_HF_TOKEN",
    "CLOUDFLARE_TURN_KEY_ID": "REALTIME_CLOUDFLARE_TURN_KEY_ID",
    "CLOUDFLARE_TURN_KEY_API_TOKEN": "REALTIME_CLOUDFLARE_TURN_KEY_API_TOKEN",
    "TWILIO_ACCOUNT_SID": "REALTIME_TWILIO_ACCOUNT_SID",
    "TWILIO_AUTH_TOKEN": "REALTIME_TWILIO_AUTH_TOKEN",
    # the remote engine's settings (--engine remote --remote-url URL --remote-token T)
    "ENDPOINT_URL": "REALTIME_REMOTE_URL",
    "ENDPOINT_TOKEN": "REALTIME_REMOTE_TOKEN",
}
OPENAI_KEY = "OPENAI_API_KEY"
"""The remote engine's token when neither REALTIME_REMOTE_TOKEN nor HF_TOKEN is set."""

# Defaults on a Space (SPACE_ID set), fit for the free cpu-basic hardware (2 vCPU, 16 GB): the Space's own
# variables, REALTIME_<NAME>, override each.
SPACE_DEFAULTS: dict[str, str] = {
    "REALTIME_HOST": "0.0.0.0",
    "REALTIME_TURN_REQUIRED": "true",
    "REALTIME_CONCURRENCY_LIMIT": "4",
    "REALTIME_SESSION_TIME_LIMIT": "300",
    "REALTIME_IDLE_TIMEOUT": "60",
    "REALTIME_MAX_CONNECTIONS_PER_CLIENT": "2",
    "REALTIME_MAX_NEW_CONNECTIONS_PER_MINUTE": "10",
    "REALTIME_CLIENT_IP_HEADER": "x-forwarded-for",
}


def on_space(environ: Mapping[str, str]) -> bool:
    return bool(environ.get("SPACE_ID") or environ.get("REALTIME_SPACE_ID"))


def space_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` with every Space variable copied onto its REALTIME_ name, and the Space defaults on a Space."""
    out = dict(environ)
    for alias, target in ENV_ALIASES.items():
        if out.get(alias) and target not in out:
            out[target] = out[alias]
    if out.get(OPENAI_KEY) and not out.get("REALTIME_REMOTE_TOKEN") and not out.get("REALTIME_HF_TOKEN"):
        out["REALTIME_REMOTE_TOKEN"] = out[OPENAI_KEY]
    if on_space(out):
        for name, value in SPACE_DEFAULTS.items():
            out.setdefault(name, value)
    return out
