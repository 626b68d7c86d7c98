# syntax=docker/dockerfile:1
# The operator image: `modelswap operator` as a non-root user. No GPU code (no `cuda` extra).
# Build from the repository root (this cannot be done on our CI machines: no container
# engine there; tests/unit/test_images.py replays the install steps in a fresh venv):
#   docker build -f images/operator.Dockerfile -t modelswap-operator:0.1.0 .
# The tag is pyproject.toml's version; so is MODELSWAP_VERSION below (a test checks).

# --- the project's wheel (pure Python: any Python builds it) ---
FROM python:3.11-slim AS wheel
COPY pyproject.toml README.md /src/
COPY api /src/api
COPY operator /src/operator
COPY sidecar /src/sidecar
COPY client /src/client
RUN pip wheel --no-cache-dir --no-deps -w /dist /src

# --- the image ---
FROM python:3.11-slim
# The source tree's version (pyproject.toml): names the wheel and labels the image.
ARG MODELSWAP_VERSION=0.1.0
LABEL org.opencontainers.image.title="modelswap-operator" \
      org.opencontainers.image.description="modelswap operator: ModelDeployments -> node agents" \
      org.opencontainers.image.version="${MODELSWAP_VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN python -m venv /opt/modelswap/venv
COPY --from=wheel /dist/ /tmp/dist/
RUN /opt/modelswap/venv/bin/pip install --no-cache-dir /tmp/dist/modelswap-${MODELSWAP_VERSION}-py3-none-any.whl && rm -rf /tmp/dist
RUN useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin modelswap
ENV PATH="/opt/modelswap/venv/bin:${PATH}" \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
ENTRYPOINT ["modelswap", "operator"]
