# syntax=docker/dockerfile:1
# The tollgate image: `docker build -t tollgate .` (BuildKit, Docker's default builder since
# 23.0, is needed for the cache mounts). How to run it: docs/operations.md.

# ---- build -----------------------------------------------------------------------------
FROM rust:1-bookworm AS builder

# cmake: pingora always builds zlib-ng (flate2 -> libz-ng-sys) with it.
RUN apt-get update \
 && apt-get install -y --no-install-recommends cmake \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /src
# The whole workspace: cargo reads every member's manifest (app/Cargo.toml names the tests
# and benches under tests/ and benches/), and migrations/ is compiled into the binary.
COPY . .

# The crate registry and target/ are cache mounts: kept between builds, never in the image.
# The rust image keeps cargo's home in /usr/local/cargo ($CARGO_HOME), not ~/.cargo. A cache
# mount is gone when the step ends, so the binary is copied out of it in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p tollgate-app --bin tollgate \
 && cp target/release/tollgate /usr/local/bin/tollgate

# ---- run -------------------------------------------------------------------------------
FROM debian:bookworm-slim

# ca-certificates: the system roots that verify replicas of a `tls: true` pool without a
# `ca_file`. Nothing else is needed: SQLite is built into the binary and TLS is rustls.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/*

RUN groupadd --system --gid 10001 tollgate \
 && useradd --system --uid 10001 --gid tollgate --home-dir /var/lib/tollgate --no-create-home \
      --shell /usr/sbin/nologin tollgate

COPY --from=builder /usr/local/bin/tollgate /usr/local/bin/tollgate
COPY conf/ /etc/tollgate/

# conf/tollgate.yaml is written for a checkout: state under ../data (relative to the file)
# and the admin API on 127.0.0.1, which nothing outside the container can reach. In the
# image the SQLite file and the secrets live in /var/lib/tollgate, and the admin listener
# binds the container's own interface so Prometheus and `tollgate admin` can reach it. It
# always needs the admin token; publish it on loopback or a private network only
# (`-p 127.0.0.1:8081:8081`), never on the public one.
RUN sed -i \
      -e 's#\.\./data/#/var/lib/tollgate/#g' \
      -e 's#--dir data/secrets#--dir /var/lib/tollgate/secrets#' \
      -e 's#^admin_listen: .*#admin_listen: 0.0.0.0:8081#' \
      /etc/tollgate/tollgate.yaml \
 && ! grep -n '\.\./data' /etc/tollgate/tollgate.yaml \
 && install -d -o tollgate -g tollgate -m 0750 /var/lib/tollgate /run/tollgate

# `serve --upgrade` and SIGQUIT meet on an upgrade socket in the temp dir, named after the
# public port (tollgate-8080.sock). With a read-only root file system, mount a tmpfs here:
# --tmpfs /run/tollgate:uid=10001,gid=10001,mode=0750
ENV TMPDIR=/run/tollgate

# The SQLite file (tollgate.db and its -wal/-shm files) and secrets/ from `init-secrets`.
VOLUME ["/var/lib/tollgate"]
WORKDIR /var/lib/tollgate
USER 10001:10001

# Public listener (`listen`) and admin listener (`admin_listen`) of conf/tollgate.yaml.
EXPOSE 8080 8081

# SIGTERM is the graceful stop: the listeners close at once, then tollgate waits the whole
# shutdown.grace_period_seconds (800 s in conf/tollgate.yaml) before it exits. Docker kills
# a container 10 s after SIGTERM unless told otherwise: run it with `--stop-timeout 900`
# (compose: `stop_grace_period: 15m`; Kubernetes: `terminationGracePeriodSeconds: 900`).
STOPSIGNAL SIGTERM

# No HEALTHCHECK: the image has no curl or wget, and the public listener has no
# unauthenticated health route. `tollgate admin health` would work (it exits non-zero unless
# GET /admin/v1/health answers 2xx) but it loads and checks the whole configuration on every
# probe, and the answer is 503 whenever the identity store is down, which would mark every
# container unhealthy at once during a database outage. Let the load balancer or the
# orchestrator probe the public port (TCP), and alert on the metrics (docs/operations.md).

ENTRYPOINT ["tollgate"]
CMD ["serve", "--config", "/etc/tollgate/tollgate.yaml"]
