# orca-runner. Pipeline binaries are added by images built FROM this one
# (COPY them to /opt/orca/pipelines and register them with that path).
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
RUN mkdir -p /opt/orca/pipelines /var/log/orca
ENV ORCA_LOGS=/var/log/orca
ENTRYPOINT ["/usr/local/bin/orca-runner"]
