# The GPU variant of the Hugging Face Space (space.yaml: gpu-vllm), as a Docker Space: a Space builds this
# file only when README.md's front matter says `sdk: docker` (the CPU variants say gradio). vLLM cannot share
# the web app's Python environment (gradio 5.50 caps pillow<12 and starlette<1.0, vLLM needs newer), so the
# image holds two virtual environments: .venv (the app, requirements.txt) and .venv-vllm (vLLM's CUDA
# wheels), where `--engine vllm` looks for vLLM by default.
# The app starts, supervises and stops the vLLM engine process itself.
#
# To use it: duplicate the Space, choose GPU hardware (L4 suggested), and in README.md's front matter apply
# space.yaml's gpu-vllm `front_matter` (sdk: docker, app_port: 7860, ...). Locally, on a machine with an
# NVIDIA GPU:  docker build -t realtime-gpu . && docker run --gpus all -p 7860:7860 -e HF_TOKEN realtime-gpu
FROM python:3.11-slim

# Triton (vLLM's kernels) compiles with gcc at start-up
RUN apt-get update && apt-get install -y --no-install-recommends build-essential git \
    && rm -rf /var/lib/apt/lists/*

# Spaces run the container as user 1000
RUN useradd -m -u 1000 user
USER user
ENV HOME=/home/user
WORKDIR /home/user/app

# vLLM first: the largest layer, rebuilt only when its version changes
ARG VLLM_VERSION=0.33.0
RUN python -m venv .venv-vllm && .venv-vllm/bin/pip install --no-cache-dir "vllm==${VLLM_VERSION}"

# the web app; its torch (for Silero VAD's package) needs no CUDA: take the CPU build
COPY --chown=user requirements.txt ./
RUN python -m venv .venv && .venv/bin/pip install --no-cache-dir \
    --extra-index-url https://download.pytorch.org/whl/cpu -r requirements.txt

COPY --chown=user . .

ENV REALTIME_ENGINE=vllm \
    REALTIME_HOST=0.0.0.0 \
    REALTIME_PORT=7860 \
    GRADIO_ANALYTICS_ENABLED=False \
    PYTHONUNBUFFERED=1
EXPOSE 7860
CMD [".venv/bin/python", "app.py"]
