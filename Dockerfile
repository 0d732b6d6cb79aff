# memento-sessions daemon image.
#   docker build -t memento-sessions .
#   docker run -p 8765:8765 -e MEMENTO_REDIS_URL=... -e MEMENTO_POSTGRES_DSN=... -e MEMENTO_AUTH_SECRET=... memento-sessions
# Without backend URLs the daemon starts its embedded Redis+FalkorDB and Postgres under /data.

FROM python:3.11.9-slim AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN python -m venv /opt/memento
WORKDIR /src
# The metadata first, so a code change does not reinstall every dependency.
COPY pyproject.toml README.md constraints.txt ./
COPY memento_sessions ./memento_sessions
RUN /opt/memento/bin/pip install ".[server]" -c constraints.txt

FROM python:3.11.9-slim
# libgomp1: the FalkorDB module of the embedded server needs it (only used without MEMENTO_REDIS_URL).
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 memento \
    && useradd --system --uid 10001 --gid memento --home-dir /data --shell /usr/sbin/nologin memento \
    && mkdir -p /data \
    && chown memento:memento /data
COPY --from=build /opt/memento /opt/memento
ENV PATH=/opt/memento/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    MEMENTO_HOST=0.0.0.0 \
    MEMENTO_PORT=8765 \
    MEMENTO_DATA_DIR=/data \
    MEMENTO_LOG_FORMAT=json
USER 10001:10001
WORKDIR /data
VOLUME ["/data"]
EXPOSE 8765
# python, not curl: the slim image has no curl. urlopen raises on any status but 2xx, so 503 is unhealthy.
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('MEMENTO_PORT', '8765') + '/readyz', timeout=2)"]
STOPSIGNAL SIGTERM
CMD ["memento-sessions", "serve"]
