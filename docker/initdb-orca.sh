#!/bin/sh
# Runs once, when the container initialises its data directory. Makes the
# runner's login (orca_runner only: no org membership, no admin) and a runner
# token for the default pool, written where the runner container reads it.
set -e
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" <<SQL
CREATE DATABASE orca;
\c orca
CREATE EXTENSION orca;
CREATE ROLE runner LOGIN PASSWORD '${ORCA_RUNNER_PASSWORD:-runner}' IN ROLE orca_runner;
SQL
if [ -d /orca-secrets ]; then
    umask 077
    psql -qtA -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" -d orca \
        -c "SELECT orca.create_runner_token('default', 'compose-runner')" > /orca-secrets/runner-token
    # The runner image's user (docker/runner.Dockerfile).
    chown 10001:10001 /orca-secrets/runner-token
fi
