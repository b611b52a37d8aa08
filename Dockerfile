# hangwatch: the exporter, the webhook, `hangwatch check` and the simulator, in one image.
#   docker build -t hangwatch:local .
#   docker run --rm hangwatch:local check http://HOST:8000
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY hangwatch ./hangwatch
COPY exporter ./exporter
COPY webhook ./webhook
COPY simulator ./simulator
COPY rules ./rules
COPY grafana/dashboards ./grafana/dashboards
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels \
 && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin hangwatch
# Unprivileged by default; the webhook service alone runs as root to open the Docker socket.
USER 10001
EXPOSE 9877 9878
ENTRYPOINT ["hangwatch"]
CMD ["--help"]
