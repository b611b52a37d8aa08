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
 && groupadd --system --gid 10001 hangwatch \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin hangwatch \
 && install -d -o 10001 -g 10001 -m 0700 /var/lib/hangwatch
# Unprivileged, the webhook included (it reaches Docker through a socket proxy). The webhook's
# state_dir belongs to this user, so a new named volume mounted there does too.
USER 10001
EXPOSE 9877 9878
ENTRYPOINT ["hangwatch"]
CMD ["--help"]
