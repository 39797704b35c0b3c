"""The Hugging Face Space: configuration files, Space variables, TURN through a real coturn, demo limits.

- README's front matter and space.yaml agree, and every variable and secret they name is read by the app;
- the app launched with SPACE_ID behaves as on a Space (TURN required, limits applied) and reaches nothing;
- relay-only WebRTC through coturn on loopback, with credentials renewed per connection (aiortc client);
- the session time limit and idle reclaim end sessions with a message;
- in headless Chromium, inside a network namespace with only `lo` (tests/space_browser.py): transcription
  through the relay, the visitor over the concurrency limit told so then admitted, wrong TURN credentials
  and an unreachable credential service explained in the page and the log.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np
import pytest
import soundfile as sf
import yaml
from coturn import start_coturn

from realtime.bench.client import StreamError, fetch_rtc_configuration, stream_file
from realtime.config import Settings, add_arguments, env_name, from_namespace
from realtime.space import ENV_ALIASES, SPACE_DEFAULTS, space_environ
from realtime.web.turn import NO_TURN, REMOTE_WITHOUT_TURN, Turn, prefer_ports, resolve_provider, rest_credentials

from conftest import ARTIFACTS, ROOT, launch, stop
from speech import SENTENCES, compose, wer

SPACE_YAML: dict[str, Any] = yaml.safe_load((ROOT / "space.yaml").read_text())
SPACE_ENV = {"SPACE_ID": "tests/realtime-space", "GRADIO_SERVER_NAME": "127.0.0.1"}
# the keys of a Space's README front matter (huggingface.co/docs/hub/spaces-config-reference)
FRONT_MATTER_KEYS = {
    "title", "emoji", "colorFrom", "colorTo", "sdk", "python_version", "sdk_version", "suggested_hardware",
    "suggested_storage", "app_file", "app_port", "base_path", "fullWidth", "header", "short_description",
    "models", "datasets", "tags", "thumbnail", "pinned", "hf_oauth", "hf_oauth_scopes",
    "hf_oauth_expiration_minutes", "disable_embedding", "startup_duration_timeout", "custom_headers",
    "preload_from_hub", "license",
}
HARDWARE = {"cpu-basic", "cpu-upgrade", "t4-small", "t4-medium", "l4x1", "l4x4", "l40sx1", "l40sx4", "l40sx8",
            "a10g-small", "a10g-large", "a10g-largex2", "a10g-largex4", "a100-large", "h100", "h100x8"}


def front_matter() -> dict[str, Any]:
    text = (ROOT / "README.md").read_text()
    assert text.startswith("---\n"), "README.md must open with the Space's YAML front matter"
    return yaml.safe_load(text[4 : text.index("\n---\n", 4)])


def space_names() -> dict[str, str]:
    """Every variable and secret named in space.yaml, with its value ('' for secrets)."""
    names: dict[str, str] = {}
    for block in [SPACE_YAML["common"], *SPACE_YAML["variants"].values()]:
        for name, spec in (block.get("variables") or {}).items():
            names[name] = str(spec.get("value", ""))
        for name in block.get("secrets") or {}:
            names.setdefault(name, "")
    return names


# -- configuration files


@pytest.mark.fast
def test_front_matter_is_space_yaml_default_variant() -> None:
    fm = front_matter()
    assert fm == SPACE_YAML["front_matter"]
    assert set(fm) <= FRONT_MATTER_KEYS, set(fm) - FRONT_MATTER_KEYS
    default = SPACE_YAML["variants"][SPACE_YAML["default_variant"]]
    assert fm["sdk"] == "gradio" and (ROOT / fm["app_file"]).is_file() and fm["app_file"] == "app.py"
    pinned = re.search(r"^gradio==(\S+)$", (ROOT / "requirements.txt").read_text(), re.M)
    assert pinned and fm["sdk_version"] == pinned.group(1) == "5.50.0"
    assert fm["suggested_hardware"] == default["hardware"] == "cpu-basic"
    assert fm["title"] and fm["emoji"] and 0 < len(fm["short_description"]) <= 60
    assert (3, 10) <= tuple(int(p) for p in fm["python_version"].split(".")[:2])  # requires-python >= 3.10


@pytest.mark.fast
def test_space_yaml_variants_document_every_setting() -> None:
    variants = SPACE_YAML["variants"]
    assert set(variants) == {"cpu", "cpu-remote", "gpu-vllm"}
    for block in [SPACE_YAML["common"], *variants.values()]:
        for kind in ("variables", "secrets"):
            for name, spec in (block.get(kind) or {}).items():
                assert spec["description"].strip(), f"{name} has no description"
    for name, v in variants.items():
        assert v["hardware"] in HARDWARE and v["description"].strip() and v["startup"].strip(), name
    assert {n: v["variables"]["REALTIME_ENGINE"]["value"] for n, v in variants.items()} == {
        "cpu": "embedded", "cpu-remote": "remote", "gpu-vllm": "vllm"}
    assert variants["cpu-remote"]["variables"]["ENDPOINT_URL"]["required"]
    assert SPACE_YAML["common"]["secrets"]["HF_TOKEN"]["required"]
    # the limits written down are the ones the app applies on a Space by default
    common = SPACE_YAML["common"]["variables"]
    for name, value in SPACE_DEFAULTS.items():
        if name in common:
            assert common[name]["value"] == value, name

    # the GPU variant: a Docker Space built from the Dockerfile, with the co-located vLLM engine
    gpu = variants["gpu-vllm"]
    gpu_fm = {k: v for k, v in {**front_matter(), **gpu["front_matter"]}.items()
              if k not in gpu["remove_from_front_matter"]}
    assert set(gpu_fm) <= FRONT_MATTER_KEYS and gpu_fm["sdk"] == "docker" and "sdk_version" not in gpu_fm
    assert gpu_fm["suggested_hardware"] == gpu["hardware"]
    assert gpu["variables"]["REALTIME_MODEL"]["value"] in gpu_fm["preload_from_hub"]
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "REALTIME_ENGINE=vllm" in dockerfile and f"REALTIME_PORT={gpu_fm['app_port']}" in dockerfile
    assert ".venv-vllm" in dockerfile and "-r requirements.txt" in dockerfile
    assert 'CMD [".venv/bin/python", "app.py"]' in dockerfile


@pytest.mark.fast
def test_the_space_guide_names_every_secret_and_the_duplicate_steps() -> None:
    guide = (ROOT / "docs" / "space.md").read_text()
    duplicate = guide[guide.index("## Duplicate this Space"):]
    duplicate = duplicate[: duplicate.index("\n## ", 5)]
    secrets = {n for b in [SPACE_YAML["common"], *SPACE_YAML["variants"].values()] for n in (b.get("secrets") or {})}
    assert secrets and all(f"`{s}`" in duplicate for s in secrets), [s for s in secrets if f"`{s}`" not in duplicate]
    assert "ENDPOINT_URL" in duplicate and "REALTIME_ENGINE=remote" in duplicate


@pytest.mark.fast
def test_every_space_variable_is_read_by_the_app() -> None:
    fields = {f.name: f for f in dataclasses.fields(Settings)}
    base = from_namespace(argparse.Namespace(), environ={})
    for name in space_names():
        target = name if name.startswith("REALTIME_") else ENV_ALIASES.get(name)
        assert target is not None, f"{name} is neither a REALTIME_ setting nor mapped in realtime/space.py"
        field = target.removeprefix("REALTIME_").lower()
        assert field in fields and env_name(field) == target, f"{name} -> {target}: no such setting"
        default = getattr(base, field)
        probe: Any = {bool: not default, int: 7, float: 7.5}.get(type(default), "probe-value")
        settings = from_namespace(argparse.Namespace(), environ={name: str(probe).lower() if probe in (True, False)
                                                                  else str(probe)})
        assert getattr(settings, field) == probe, f"{name} does not reach --{field.replace('_', '-')}"


@pytest.mark.fast
def test_space_variables_map_onto_settings() -> None:
    env = {**SPACE_ENV, "GRADIO_SERVER_NAME": "0.0.0.0", "GRADIO_SERVER_PORT": "7860", "HF_TOKEN": "hf_x",
           "ENDPOINT_URL": "https://e.example/api/v1/audio/transcriptions", "ENDPOINT_TOKEN": "tok",
           "REALTIME_CONCURRENCY_LIMIT": "9"}
    s = from_namespace(argparse.Namespace(), environ=env)
    assert (s.space_id, s.host, s.port, s.hf_token) == ("tests/realtime-space", "0.0.0.0", 7860, "hf_x")
    assert (s.remote_url, s.remote_token) == (env["ENDPOINT_URL"], "tok")
    assert s.turn_required and s.session_time_limit == 300 and s.idle_timeout == 60
    assert s.concurrency_limit == 9  # the Space's own variable wins over the Space default
    local = from_namespace(argparse.Namespace(), environ={"HF_TOKEN": "hf_x"})
    assert (local.host, local.turn_required, local.concurrency_limit, local.idle_timeout) == ("127.0.0.1", False, 16, 0)
    # a REALTIME_ variable wins over the Space's name for it, and a flag over both
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    s = from_namespace(parser.parse_args(["--host", "127.0.0.1"]),
                       environ={**SPACE_ENV, "GRADIO_SERVER_NAME": "0.0.0.0", "HF_TOKEN": "theirs",
                                "REALTIME_HF_TOKEN": "mine"})
    assert s.host == "127.0.0.1" and s.hf_token == "mine"
    assert space_environ({"HF_TOKEN": ""}) == {"HF_TOKEN": ""}  # an empty Space secret sets nothing
    # a public Space keeps no history unless it has a key (every visitor could read every session), or is told to
    assert not s.history and local.history
    from realtime.web.history_tab import render_off

    assert "REALTIME_API_KEY" in render_off(s, None) and "--no-history" not in render_off(s, None)
    assert from_namespace(argparse.Namespace(), environ={**SPACE_ENV, "REALTIME_API_KEY": "k"}).history
    assert from_namespace(argparse.Namespace(), environ={**SPACE_ENV, "REALTIME_HISTORY": "true"}).history
    assert from_namespace(parser.parse_args(["--api-key", "k"]), environ=SPACE_ENV).history


@pytest.mark.fast
def test_turn_provider_order_and_credentials() -> None:
    def provider(**kw: Any) -> str:
        return resolve_provider(Settings(**kw))

    keys = {"cloudflare_turn_key_id": "k", "cloudflare_turn_key_api_token": "t"}
    twilio = {"twilio_account_sid": "AC", "twilio_auth_token": "t"}
    assert provider() == "none" and provider(hf_token="h") == "none"  # HF_TOKEN alone means TURN only on a Space
    assert provider(hf_token="h", space_id="a/b") == "hf"
    assert provider(hf_token="h", space_id="a/b", **twilio) == "twilio"
    assert provider(hf_token="h", **twilio, **keys) == "cloudflare"
    assert provider(turn_url="turn:x", hf_token="h", **keys) == "static"
    assert provider(turn_url="turn:x", turn_shared_secret="s") == "secret"
    assert provider(turn_url="turn:x", turn_provider="hf") == "hf"
    username, credential = rest_credentials("secret", 600, now=1_000_000)
    assert username == "1000600:realtime" and credential == "RXXhVlscGFLEUDz8JGvJhhkSPS0="
    # on a Space the server's own peer may only connect out to 80, 443 and 8080: those URLs go first
    cloudflare = [{"urls": ["stun:stun.cloudflare.com:3478"]},
                  {"urls": ["turn:turn.cloudflare.com:3478?transport=udp", "turn:turn.cloudflare.com:80?transport=tcp",
                            "turns:turn.cloudflare.com:443?transport=tcp"], "username": "u", "credential": "c"}]
    first = prefer_ports(cloudflare, (443, 80, 8080))[0]
    assert prefer_ports(cloudflare, (443, 80, 8080))[1]["urls"] == ["stun:stun.cloudflare.com:3478"]
    assert first["urls"][:2] == ["turns:turn.cloudflare.com:443?transport=tcp",
                                 "turn:turn.cloudflare.com:80?transport=tcp"]


@pytest.mark.fast
def test_page_notice_for_browsers_that_may_not_connect() -> None:
    local = Turn(Settings())  # no TURN: fine on this machine, a note for a page opened from elsewhere
    assert local.notice(None) is None
    assert all(local.notice(h) is None for h in ("127.0.0.1:7860", "localhost:7860", "[::1]:7860"))
    assert local.notice("192.168.1.20:7860") == REMOTE_WITHOUT_TURN
    space = Turn(Settings(space_id="a/b", turn_required=True))  # TURN required and missing: said to everyone
    assert space.notice(None) == space.notice("127.0.0.1:7860") == NO_TURN == space.error
    with pytest.raises(ValueError, match="--ice-transport-policy"):
        Turn(Settings(ice_transport_policy="relay-only"))


# -- the app as users launch it


@pytest.fixture(scope="module")
def one_sentence(speech_dir: Path):
    return compose(speech_dir / "space-one.wav", SENTENCES[3:4], tail=0.5)


def test_space_without_turn_says_why_and_refuses(tmp_path: Path, one_sentence: Any) -> None:
    app = launch(tmp_path, env=SPACE_ENV)
    try:
        h = app.health()
        assert h["space"] == "tests/realtime-space"
        assert h["limits"] == {"concurrency_limit": 4, "session_time_limit_s": 300.0, "idle_timeout_s": 60.0,
                               "connections": 0, "reclaimed": {}}
        assert h["turn"]["required"] and h["turn"]["provider"] == "none" and h["turn"]["error"] == NO_TURN
        r = httpx.get(f"{app.url}/webrtc/rtc-configuration")
        assert r.status_code == 503 and r.json()["error"]["message"] == NO_TURN
        with pytest.raises(StreamError, match="turn_unavailable: No TURN relay is configured"):
            asyncio.run(stream_file(app.url, one_sentence.path, ice_loopback=True))
        assert app.health()["limits"]["connections"] == 0
        # the page carries the explanation from the start (the notice's value in Gradio's config)
        config = httpx.get(f"{app.url}/config").text
        assert "No TURN relay is configured, so browsers outside this server" in config
        log = app.log.read_text()
        assert "TURN relay required but none configured" in log and "refused: No TURN relay is configured" in log
    finally:
        stop(app)


def test_relay_only_through_coturn_with_credentials_renewed(tmp_path: Path, one_sentence: Any) -> None:
    turn = start_coturn(tmp_path, secret="coturn-shared-secret")
    app = launch(tmp_path, "--turn-url", turn.url, "--turn-shared-secret", "coturn-shared-secret", "--turn-ttl", "20",
                 "--ice-transport-policy", "relay")
    try:
        async def relay_stream() -> tuple[dict[str, Any], Any]:
            config = await fetch_rtc_configuration(app.url)
            return config, await stream_file(app.url, one_sentence.path, ice_servers=config["iceServers"],
                                             relay_only=True)

        config1, first = asyncio.run(relay_stream())
        assert config1["iceTransportPolicy"] == "relay"
        user1 = config1["iceServers"][0]["username"]
        expiry = int(user1.split(":")[0])
        assert abs(expiry - (time.time() + 20)) < 20
        # credentials are shared until 10 s (ttl / 2) before they expire, then renewed for the next connection
        time.sleep(max(0.0, expiry - 10 + 1.5 - time.time()))  # (the user name rounds the expiry down)
        config2, second = asyncio.run(relay_stream())
        user2 = config2["iceServers"][0]["username"]
        assert user2 != user1 and int(user2.split(":")[0]) > expiry
        for result in (first, second):
            assert wer(one_sentence.text, result.summary["text"]) <= 0.2, result.summary
        h = app.health()["turn"]
        assert h["provider"] == "secret" and h["relay_only"] and h["ok"] and h["credentials_fetched"] >= 2
        coturn_log = turn.log.read_text(errors="replace")
        for user in (user1, user2):  # both the client's and the server's relays were allocated with them
            assert coturn_log.count(f"username=<{user}>, lifetime=600") >= 2, user
    finally:
        stop(app)
        turn.stop()


def test_session_time_limit_and_idle_reclaim(tmp_path: Path, speech_dir: Path) -> None:
    """Two sessions over WebRTC: one silent, reclaimed after the idle timeout; one talking, ended at the session
    time limit with a message after its first sentences were transcribed (the limit leaves the first final seconds
    to spare on a busy machine), its transcript still downloadable."""
    app = launch(tmp_path, "--session-time-limit", "8", "--idle-timeout", "3")
    silence = tmp_path / "silence.wav"
    sf.write(silence, np.zeros(16000 * 9, dtype=np.float32), 16000, subtype="PCM_16")
    talk = compose(speech_dir / "space-talk.wav", SENTENCES[:4], gaps=[1.0, 1.0, 1.0])
    try:
        async def both() -> list[Any]:
            return await asyncio.gather(stream_file(app.url, silence, ice_loopback=True),
                                        stream_file(app.url, talk.path, ice_loopback=True))

        quiet, talking = asyncio.run(both())
        idle = [e for e in quiet.events if e["type"] == "closed"]
        assert idle and idle[0]["reason"] == "idle" and "3 s without speech" in idle[0]["message"]
        timed = [e for e in talking.events if e["type"] == "closed"]
        assert timed and timed[0]["reason"] == "time_limit" and "8 s per session" in timed[0]["message"]
        assert talking.events.index(timed[0]) == len(talking.events) - 1, "nothing follows the closed event"
        assert [e for e in talking.events if e["type"] == "final"], "it transcribed until the limit"
        assert talking.summary["text"] and wer(talk.text, talking.summary["text"]) > 0.2  # cut short, not finished
        h = app.health()
        assert h["limits"]["reclaimed"] == {"idle": 1, "time_limit": 1} and h["limits"]["connections"] == 0
        assert httpx.get(f"{app.url}/transcript/{talking.webrtc_id}.txt").status_code == 200  # still downloadable
        log = app.log.read_text()
        assert f"session {quiet.webrtc_id} ended (idle)" in log
        assert f"session {talking.webrtc_id} ended (time_limit)" in log
    finally:
        stop(app)


# -- headless Chromium


def test_space_in_headless_chromium(tmp_path_factory: pytest.TempPathFactory) -> None:
    for tool in ("/usr/bin/chromium", "unshare", "ip", "turnserver"):
        assert shutil.which(tool), f"{tool} is required (tests/run.sh installs chromium, util-linux, iproute2, coturn)"
    import playwright.sync_api  # noqa: F401  (an ImportError fails the test; it must not skip)

    tmp = tmp_path_factory.mktemp("space-browser")
    page_speech = compose(tmp / "page.wav", SENTENCES[:1], lead=0.5, tail=1.5)  # looped by the fake microphone
    holder_speech = compose(tmp / "holder.wav", SENTENCES[1:3], gaps=[1.0])
    ARTIFACTS.mkdir(exist_ok=True)
    out = tmp / "result.json"
    check = [sys.executable, str(ROOT / "tests" / "space_browser.py"), "--wav", str(page_speech.path),
             "--holder-wav", str(holder_speech.path), "--out", str(out), "--shots", str(ARTIFACTS)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(["unshare", "--net", "bash", "-c", 'ip link set lo up && exec "$@"', "netns", *check],
                          cwd=ROOT, capture_output=True, text=True, timeout=1000, env=env)
    assert proc.returncode == 0 and out.exists(), f"browser check failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    r = json.loads(out.read_text())
    relay, wrong, offline = r["relay"], r["wrong_credentials"], r["hf_token_offline"]
    print(f"\nscenario seconds {r['timings']}; relay: start click -> two finals {relay['admitted']['text_s']} s, "
          f"ended after {relay['ended']['after_s']} s; coturn allocations {r['coturn_allocations']}")
    if "first_try" in relay:
        print(f"the page's first start after the holder left gave no session; loaded again: {relay['first_try']}")
    story = {k: relay.get(k) for k in ("first_try", "admitted", "ended", "ice_pairs")} | {
        "app_log": relay["app_log"][-3000:], "coturn_log": r["coturn_log"][-1500:]}

    # as on a Space: TURN required, the limits applied
    h = relay["health"]
    assert h["space"] == "tests/realtime-space" and h["turn"]["required"] and h["turn"]["ok"]
    assert h["limits"]["concurrency_limit"] == 1 and h["limits"]["idle_timeout_s"] == 60.0

    # an aiortc client, relay only, holds the one place; the page is told the demo is full
    assert relay["holder_connected"] and relay["holder"].get("summary"), relay["holder"]
    assert relay["holder"]["config"]["iceTransportPolicy"] == "relay"
    assert wer(holder_speech.text, relay["holder"]["summary"]["text"]) <= 0.2, relay["holder"]["summary"]
    refused = relay["refused"]
    assert any("Too many concurrent connections" in t for t in refused["toasts"]), refused
    assert "This demo is full: 1 session at a time" in refused["notice"] and refused["stream"] == "closed"

    # after it leaves, the page gets in and transcribes through the relay only
    assert relay["freed"]
    finals = relay["admitted"]["finals"]
    assert finals and min(wer(page_speech.text, f) for f in finals) <= 0.35, story
    assert relay["ice_pairs"] and all(p["local"][1] == p["remote"][1] == "relay" and p["policy"] == "relay"
                                      for p in relay["ice_pairs"]), relay["ice_pairs"]
    assert r["coturn_allocations"] >= 4

    # the session time limit ends the page's session with a message, and the page stops its stream
    ended = relay["ended"]
    assert "This demo allows 20 s per session" in ended["status"] and ended["stream"] == "closed", story
    assert any("20 s per session" in t for t in ended["toasts"]), ended["toasts"]
    assert relay["health_after"]["limits"]["reclaimed"].get("time_limit") == 1

    # wrong TURN credentials: said in the page when it loads and when the visitor presses start, and logged
    reason = "refused the credentials of user 'alice' (401 Unauthorized)"
    assert reason in wrong["loaded"]["notice"] and wrong["loaded"]["notice"].startswith("WebRTC cannot connect")
    assert any(reason in t for t in wrong["clicked"]["toasts"]) and wrong["clicked"]["stream"] == "closed"
    assert not wrong["health"]["turn"]["ok"] and reason in wrong["health"]["turn"]["error"]
    assert "TURN relay unavailable: TURN server (--turn-url): the relay at turn:127.0.0.1" in wrong["app_log"]
    assert reason in wrong["app_log"] and "refused: TURN server (--turn-url)" in wrong["app_log"]

    # HF_TOKEN where Cloudflare's credential service cannot be reached: the same, with that reason
    reason = "Cloudflare TURN via HF_TOKEN: could not get credentials (ConnectError"
    assert reason in offline["loaded"]["notice"] and any(reason in t for t in offline["clicked"]["toasts"])
    assert offline["clicked"]["stream"] == "closed" and reason in offline["app_log"]

    # the page only ever asked its own server for anything
    for scenario in (relay, wrong, offline):
        outside = [u for u in scenario["requests"] if not u.startswith("console ")
                   and urlsplit(u).scheme not in ("data", "blob") and urlsplit(u).hostname != "127.0.0.1"]
        assert not outside, outside
