# replicad container image.
#   docker build -t replicad .
#   docker run -e REPLICAD_REPLICA=r1 -e REPLICAD_ZOOKEEPER__HOSTS=zk1:2181,zk2:2181 \
#              -e REPLICAD_INTERSERVER__HOST=<address peers reach> \
#              -e REPLICAD_INTERSERVER__USER=replica -e REPLICAD_INTERSERVER__PASSWORD=<shared secret> \
#              -e REPLICAD_API__USERS='[{name: writer, password_sha256_hex: "<sha256 of the password>"}]' \
#              -v replicad-data:/var/lib/replicad replicad
#              --stop-timeout 60 \
# The configuration is /etc/replicad/replicad.yaml (config/docker/replicad.yaml: no replica name and no tables
# of its own; mount your own file or set REPLICAD_REPLICA, REPLICAD_TABLES …); REPLICAD_<SECTION>__<KEY>
# overrides it. A replica without REPLICAD_REPLICA refuses to start (exit 78).
# Stop grace: a stop drains inserts for up to api.drain_timeout_s (30 s) and then leaves ZooKeeper in order;
# Docker's default grace is 10 s, so give `--stop-timeout 60` (compose: stop_grace_period: 60s).
# Both listeners bind 0.0.0.0 here (a container is reached from outside), so the daemon refuses to start
# (exit 78, every problem listed) until API users and interserver credentials are given: there is no
# open default.  `echo -n 'the password' | sha256sum` gives the hash.

FROM python:3.11-slim AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY replicad ./replicad
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --system --home-dir /var/lib/replicad --shell /usr/sbin/nologin replicad \
 && mkdir -p /var/lib/replicad /etc/replicad \
 && chown replicad:replicad /var/lib/replicad
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
COPY config/docker/replicad.yaml /etc/replicad/replicad.yaml
ENV PYTHONUNBUFFERED=1 \
    REPLICAD_API__LISTEN_HOST=0.0.0.0 \
    REPLICAD_INTERSERVER__LISTEN_HOST=0.0.0.0
USER replicad
VOLUME /var/lib/replicad
EXPOSE 8123 9009
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s \
  CMD ["python", "-c", "import sys, urllib.request; r = urllib.request.urlopen('http://127.0.0.1:8123/ping', timeout=2); sys.exit(0 if r.status == 200 else 1)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["replicad"]
CMD ["run", "--config", "/etc/replicad/replicad.yaml"]
