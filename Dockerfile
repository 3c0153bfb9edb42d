# syntax=docker/dockerfile:1
# The tiergate image: the gateway (`tiergate serve`), its admin CLI (`tiergate db upgrade`, ...)
# and the emulated engine (`tiergate engine-sim`), from one `pip install .`.
#
#   docker build -t tiergate/tiergate:0.1.0 .
#
# Base image: pinned by tag to the Python minor the test suite runs on (3.11) and to Debian
# bookworm, the distribution CI's services come from. For production pin it by digest too
# (`python:3.11.13-slim-bookworm@sha256:...`, from `docker buildx imagetools inspect`): no
# container registry is reachable where this file was written, so no digest could be resolved.
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

# ---- build: a virtual environment holding tiergate and its dependencies -------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/tiergate
WORKDIR /src
COPY pyproject.toml README.md tiergate_cli.py ./
COPY priority/ priority/
COPY gateway/ gateway/
COPY engine_common/ engine_common/
COPY engine_cuda/ engine_cuda/
COPY engine_ascend/ engine_ascend/
COPY engine_emulated/ engine_emulated/
COPY admin_ui/ admin_ui/
COPY migrations/ migrations/
RUN /opt/tiergate/bin/pip install . \
    && /opt/tiergate/bin/python -c "import gateway, priority, tiergate_cli"
# The wheel ships Alembic's scripts (the `migrations` package) where gateway/db/migrate.py looks;
# tests/deploy/test_dockerfile.py replays this install and runs `tiergate db upgrade` on it.

# ---- runtime: the virtual environment, a non-root user, nothing else ---------------------
FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="tiergate" \
      org.opencontainers.image.description="SLO-aware, multi-priority LLM serving gateway" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 tiergate \
    && useradd --system --uid 10001 --gid tiergate --home-dir /var/lib/tiergate \
        --shell /usr/sbin/nologin tiergate \
    && install -d -o tiergate -g tiergate -m 0750 /var/lib/tiergate
COPY --from=build /opt/tiergate /opt/tiergate
ENV PATH=/opt/tiergate/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/var/lib/tiergate \
    TIERGATE_DATA_DIR=/var/lib/tiergate \
    TIERGATE_METRICS_ADDR=0.0.0.0:9464
WORKDIR /var/lib/tiergate
USER 10001:10001
# 8000: the OpenAI API (publish it); 9464: /metrics, the operator listener (Prometheus only).
EXPOSE 8000 9464
# Liveness, not readiness: a gateway whose backends are all down is alive and must not be
# restarted for it (Compose and Kubernetes check readiness themselves, on /health/readiness).
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/health/liveliness', timeout=2).status != 200)"]
ENTRYPOINT ["tiergate"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000", "--no-emulated"]
