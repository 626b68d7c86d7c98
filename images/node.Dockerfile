# syntax=docker/dockerfile:1
# The node image: PID 1 `modelswap node` supervises the agent (`modelswap sidecar`, in its
# own venv with the `cuda` extra) and the base image's `tritonserver`, each under its own
# uid. Build from the repository root (this cannot be done on our CI machines: no container
# engine there; tests/unit/test_images.py replays the install steps in fresh venvs):
#   docker build -f images/node.Dockerfile -t modelswap-node:0.1.0 .
# The tag is pyproject.toml's version; so is MODELSWAP_VERSION below (a test checks).
#
# Triton 25.02 is Ubuntu 24.04 with Python 3.12: its python-backend stubs embed that system
# Python, and the agent's venv is made from it too (the agent needs 3.11+; an Ubuntu 22.04
# based Triton, 24.xx and older, has only 3.10 and would need a second Python for the
# agent). docs/operations.md lists which Triton release ships which Python.
ARG TRITON_RELEASE=25.02

# --- the project's wheel (pure Python: any Python builds it) ---
FROM python:3.11-slim AS wheel
COPY pyproject.toml README.md /src/
COPY api /src/api
COPY operator /src/operator
COPY sidecar /src/sidecar
COPY client /src/client
RUN pip wheel --no-cache-dir --no-deps -w /dist /src

# --- the image ---
FROM nvcr.io/nvidia/tritonserver:${TRITON_RELEASE}-py3
ARG TRITON_RELEASE
# The source tree's version (pyproject.toml): names the wheel and labels the image.
ARG MODELSWAP_VERSION=0.1.0
LABEL org.opencontainers.image.title="modelswap-node" \
      org.opencontainers.image.description="modelswap node: supervisor, agent and tritonserver" \
      org.opencontainers.image.version="${MODELSWAP_VERSION}" \
      org.opencontainers.image.base.name="nvcr.io/nvidia/tritonserver:${TRITON_RELEASE}-py3" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3-venv \
 && rm -rf /var/lib/apt/lists/*
# The agent's venv: every dependency, CUDA included; invisible to the stubs' Python.
RUN python3 -m venv /opt/modelswap/venv
COPY --from=wheel /dist/ /tmp/dist/
RUN /opt/modelswap/venv/bin/pip install --no-cache-dir "/tmp/dist/modelswap-${MODELSWAP_VERSION}-py3-none-any.whl[cuda]"
# For the python-backend stubs (the system Python): the same wheel without dependencies in
# a folder of its own, put on that Python's path by a .pth file, plus cuda-bindings (the
# spec of the `cuda` extra) for the client's CUDA mappers. The client needs nothing else
# (numpy/torch/cupy views only where the model's environment has them); --target keeps
# pip off the system site-packages (PEP 668) and the `modelswap` script off PATH.
RUN /opt/modelswap/venv/bin/pip install --no-cache-dir --target /opt/modelswap/stub-lib "cuda-bindings>=12.6" \
 && /opt/modelswap/venv/bin/pip install --no-cache-dir --no-deps --target /opt/modelswap/stub-lib "/tmp/dist/modelswap-${MODELSWAP_VERSION}-py3-none-any.whl" \
 && rm -rf /tmp/dist
RUN site="$(python3 -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" \
 && mkdir -p "$site" \
 && echo /opt/modelswap/stub-lib > "$site/modelswap-client.pth"
# The models' packages, in the stubs' Python itself (its site-packages is the environment
# every python-backend stub runs in; docs/TRITON.md says how to bring others): a CUDA build
# of torch from PyTorch's index for the CUDA the base image ships (Triton 25.02: CUDA
# 12.8), first and alone, at the release constraints-triton.txt pins (pip's `==2.13.0`
# takes the index's `2.13.0+cu128`); then transformers and safetensors at that file's
# versions, the ones the tests' stub environment passes with (numpy stays below 2, which
# the python backend needs). The system Python is Ubuntu's (PEP 668), hence
# --break-system-packages. tests/unit/test_images.py does not replay this step: it writes
# nothing under /opt/modelswap, and no CUDA build can be installed on the CI machines.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
COPY constraints-triton.txt /tmp/constraints-triton.txt
RUN torch_pin="$(grep -E '^torch==' /tmp/constraints-triton.txt)" \
 && python3 -m pip install --no-cache-dir --break-system-packages \
        --index-url "${TORCH_INDEX_URL}" "${torch_pin}" \
 && python3 -m pip install --no-cache-dir --break-system-packages \
        -c /tmp/constraints-triton.txt transformers safetensors \
 && python3 -c "import torch, transformers, safetensors, numpy; assert numpy.__version__ < '2'" \
 && rm /tmp/constraints-triton.txt
# The children's users (the supervisor switches to them; see docs/operations.md). The
# runtime joins the agent's socket group so Triton's stubs can reach the agent's socket.
# Fixed gids: the chart's pod sets fsGroup to the agent's group (10001) so that only the
# agent can read the mounted control token.
RUN groupadd --system --gid 10010 modelswap-socket \
 && groupadd --system --gid 10001 modelswap-agent \
 && groupadd --system --gid 10002 modelswap-runtime \
 && useradd --system --uid 10001 --gid modelswap-agent --groups modelswap-socket --no-create-home --shell /usr/sbin/nologin modelswap-agent \
 && useradd --system --uid 10002 --gid modelswap-runtime --groups modelswap-socket --no-create-home --shell /usr/sbin/nologin modelswap-runtime
ENV PATH="/opt/modelswap/venv/bin:${PATH}" \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Root, on purpose: the supervisor needs it to run the agent and tritonserver under their
# own uids (capabilities: SETUID, SETGID, KILL, FOWNER; docs/operations.md says why).
USER root
ENTRYPOINT ["modelswap", "node"]
