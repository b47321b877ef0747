# PostgreSQL 15 with the orca extension installed and preloaded.
# Build from the repository root:  docker build -f docker/postgres.Dockerfile -t orca-postgres .
# (Not built in CI: the development machines have no Docker engine.)
FROM rust:1.95-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends wget gnupg lsb-release ca-certificates \
 && echo "deb http://apt.postgresql.org/pub/repos/apt bookworm-pgdg main" > /etc/apt/sources.list.d/pgdg.list \
 && wget -qO- https://www.postgresql.org/media/keys/ACCC4CF8.asc | gpg --dearmor > /etc/apt/trusted.gpg.d/pgdg.gpg \
 && apt-get update \
 && apt-get install -y --no-install-recommends postgresql-server-dev-15 libclang-dev clang \
 && rm -rf /var/lib/apt/lists/*
RUN cargo install cargo-pgrx --version 0.18.1 --locked \
 && cargo pgrx init --pg15 /usr/lib/postgresql/15/bin/pg_config
WORKDIR /src
COPY . .
RUN cargo pgrx package -p orca-ext --pg-config /usr/lib/postgresql/15/bin/pg_config --out-dir /out

FROM postgres:15-bookworm
COPY --from=build /out/usr/lib/postgresql/15/lib/ /usr/lib/postgresql/15/lib/
COPY --from=build /out/usr/share/postgresql/15/extension/ /usr/share/postgresql/15/extension/
COPY migrations/ /tmp/orca-migrations/
RUN for f in /tmp/orca-migrations/orca--*.sql; do \
      [ -e "/usr/share/postgresql/15/extension/$(basename "$f")" ] || cp "$f" /usr/share/postgresql/15/extension/; \
    done && rm -rf /tmp/orca-migrations
COPY docker/initdb-orca.sh /docker-entrypoint-initdb.d/10-orca.sh
CMD ["postgres", "-c", "shared_preload_libraries=orca", "-c", "orca.databases=orca", "-c", "orca.tick_ms=1000"]
