# orca-runner. Pipeline binaries are added by images built FROM this one
# (COPY them to /opt/orca/pipelines, the runner's --pipelines root, and
# register them there with `orca register`, which pins their sha256).
# Build from the repository root:  docker build -f docker/runner.Dockerfile -t orca-runner .
# (Not built in CI: the development machines have no Docker engine.)
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release -p orca-runner

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates postgresql-client \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/orca-runner /usr/local/bin/orca-runner
# The runner runs as an ordinary user: pipeline binaries inherit it. The
# pipeline root belongs to root, so nothing the runner runs can replace a
# pinned binary.
RUN useradd --system --uid 10001 --home-dir /var/lib/orca --create-home orca \
 && mkdir -p /opt/orca/pipelines /var/log/orca && chown orca:orca /var/log/orca
ENV ORCA_LOGS=/var/log/orca ORCA_PIPELINES=/opt/orca/pipelines
USER orca
ENTRYPOINT ["/usr/local/bin/orca-runner"]
