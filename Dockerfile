# The API and the fan-out worker: one image, two commands (docs/deploy.md).
#   docker build -t timeline .
#   docker run timeline                    # the API (timeline-api), port 8080
#   docker run timeline fanout-worker      # a worker, metrics on 9102
# BASE: any Debian-based image with python3 (3.11+) and its venv module. The default is
# Docker Hub's; where no registry is reachable, build one from Debian packages
# (deploy/container/base-image.sh) and pass --build-arg BASE=localhost/debian-python:bookworm.
ARG BASE=docker.io/library/python:3.12-slim-bookworm
# checkov:skip=CKV_DOCKER_7: both stages use BASE, whose tag is pinned above

FROM ${BASE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    UV_NO_CACHE=1 UV_PYTHON_DOWNLOADS=never UV_PROJECT_ENVIRONMENT=/opt/timeline
RUN python3 -m venv --without-pip /opt/timeline
WORKDIR /src
COPY requirements-uv.txt pyproject.toml uv.lock README.md ./
COPY timeline ./timeline
COPY api ./api
COPY fanout_worker ./fanout_worker
# The runtime dependencies only (no extras) at the versions in uv.lock, and the project as a
# regular install, by uv (from requirements-uv.txt, in this stage only). Behind a
# TLS-inspecting proxy, pass its CA bundle: --secret id=pip_cert,src=/path/to/ca.pem
RUN --mount=type=secret,id=pip_cert \
    if [ -s /run/secrets/pip_cert ]; then \
        export PIP_CERT=/run/secrets/pip_cert SSL_CERT_FILE=/run/secrets/pip_cert; fi \
    && python3 -m venv /opt/uv \
    && /opt/uv/bin/pip install -r requirements-uv.txt \
    && /opt/uv/bin/uv sync --locked --no-editable \
    && find /opt/timeline -name __pycache__ -prune -exec rm -rf {} +

FROM ${BASE} AS runtime
RUN groupadd --gid 10001 timeline \
    && useradd --uid 10001 --gid timeline --home-dir /home/timeline --create-home \
       --no-log-init --shell /usr/sbin/nologin timeline
COPY --from=build /opt/timeline /opt/timeline
COPY deploy/container/healthcheck.py /opt/timeline/healthcheck.py
ENV PATH=/opt/timeline/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    TIMELINE_HOST=0.0.0.0 \
    TIMELINE_PORT=8080 \
    TIMELINE_WORKER_METRICS_PORT=9102 \
    TIMELINE_DATA_DIR=/home/timeline/data \
    TIMELINE_LOG_FORMAT=json
USER 10001:10001
WORKDIR /home/timeline
EXPOSE 8080 9102
# The API: /readyz (storage reachable and initialised); a worker: its metrics endpoint.
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python3", "/opt/timeline/healthcheck.py"]
STOPSIGNAL SIGTERM
CMD ["timeline-api"]
