# hangwatch: the exporter, the webhook, `hangwatch check` and the simulator, in one image.
#   docker build -t hangwatch:local .
#   docker run --rm hangwatch:local --version
#   docker run --rm hangwatch:local check http://HOST:8000
#
# The base image is pinned by its tag and by the digest of that tag's multi-architecture index,
# so every rebuild starts from the same Python and Debian until someone moves the pin on
# purpose. To move it (a new Python patch release, Debian security updates):
#   docker buildx imagetools inspect python:3.11-slim-bookworm   # the index digest, and the version in its tags
#   # or: docker pull python:3.11-slim-bookworm && docker inspect -f '{{index .RepoDigests 0}}' python:3.11-slim-bookworm
#   # and: docker run --rm python:3.11-slim-bookworm python -V   # the exact 3.11.X for the tag below
# then write python:3.11.X-slim-bookworm@sha256:<digest> below, rebuild, and run the tests
# (tests/test_compose.py checks the pin's form). For one build only:
#   docker build --build-arg PYTHON_IMAGE=python:3.12-slim-bookworm .     # any Python >= 3.11 image
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm@sha256:65a93d69fa75478d554f4ad27c85c1e69fa184956261b4301ebaf6dbb0a3543d

FROM ${PYTHON_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_ROOT_USER_ACTION=ignore

# 1. The dependencies, alone, into the venv the image runs: pyproject.toml's [project]
#    dependencies and nothing else, so this stage (and the final image's layer copied from it)
#    is rebuilt only when pyproject.toml changes, never for a code change.
FROM base AS deps
COPY pyproject.toml /tmp/pyproject.toml
RUN python -c 'import tomllib; print("\n".join(tomllib.load(open("/tmp/pyproject.toml", "rb"))["project"]["dependencies"]))' \
        > /tmp/requirements.txt \
 && python -m venv /opt/hangwatch \
 && /opt/hangwatch/bin/pip install -r /tmp/requirements.txt

# 2. hangwatch itself: a wheel without dependencies (they are stage 1's).
FROM base AS wheel
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY hangwatch ./hangwatch
COPY exporter ./exporter
COPY webhook ./webhook
COPY simulator ./simulator
COPY rules ./rules
COPY grafana/dashboards ./grafana/dashboards
COPY demo ./demo
COPY examples ./examples
RUN pip wheel --no-deps --wheel-dir /wheels .

# 3. The image: the user, the dependencies' layer, then the small layer a code change makes.
FROM base
LABEL org.opencontainers.image.title="hangwatch" \
      org.opencontainers.image.description="Keeps self-hosted LLM servers alive without hurting them" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/hangwatch/hangwatch"
RUN groupadd --system --gid 10001 hangwatch \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin hangwatch \
 && install -d -o 10001 -g 10001 -m 0700 /var/lib/hangwatch
COPY --from=deps /opt/hangwatch /opt/hangwatch
COPY --from=wheel /wheels /wheels
RUN /opt/hangwatch/bin/pip install --no-deps /wheels/*.whl && rm -rf /wheels
COPY deploy/healthcheck.py /usr/local/lib/hangwatch/healthcheck.py
ENV PATH=/opt/hangwatch/bin:$PATH
# Unprivileged, the webhook included (it reaches Docker through a socket proxy). The webhook's
# state_dir belongs to this user, so a new named volume mounted there does too.
USER 10001
EXPOSE 9877 9878
# Asks the hangwatch server in this container about itself (the exporter's /metrics, the
# webhook's /healthz), never a model server; other commands are healthy (deploy/healthcheck.py).
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python", "/usr/local/lib/hangwatch/healthcheck.py"]
# Both servers stop at once on SIGTERM or SIGINT (the webhook finishes a restart under way
# first), also as PID 1. docker-compose.yml adds `init: true` as well: a signal that arrives
# before hangwatch has installed its handlers, or one it does not handle, still stops it.
ENTRYPOINT ["hangwatch"]
CMD ["--help"]
