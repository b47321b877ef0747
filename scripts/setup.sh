#!/usr/bin/env bash
# Installs what Orca needs to run on Debian 12 with PostgreSQL 15, builds the
# extension and installs it into the system's PostgreSQL directories.
# Idempotent: each step is skipped when already done, and what it will
# install is said before anything is.
#
#   scripts/setup.sh           what running Orca needs (the quick start's)
#   scripts/setup.sh --tests   and what the test suite needs besides: a
#                              browser, NATS and Redis, the older releases'
#                              libraries, the Python clients the tests read
#                              with, wal_level = logical (scripts/test.sh)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ORCA_ROOT"
tests=0
for arg in "$@"; do
    case "$arg" in
        --tests) tests=1 ;;
        *) die "usage: scripts/setup.sh [--tests]" ;;
    esac
done
PY="${ORCA_TEST_PYTHON:-/var/tmp/orca-py/bin/python}"
ST="${ORCA_TEST_SCHEMATHESIS:-/var/tmp/orca-st/bin/schemathesis}"
PW="${ORCA_TEST_PLAYWRIGHT:-/var/tmp/orca-pw/bin/python}"
AZ="${ORCA_TEST_AZURITE_DIR:-/var/tmp/orca-azurite}"
AZURITE_VERSION=3.37.0
SPARK_PY="${ORCA_TEST_SPARK_PYTHON:-/var/tmp/orca-spark/bin/python}"
PYSPARK_VERSION=4.0.1
FLINK_PY="${ORCA_TEST_FLINK_PYTHON:-/var/tmp/orca-flink/bin/python}"
FLINK_VERSION=2.3.0
has() { "$PY" -c "$1" 2>/dev/null; }
flink_lib_present() {
    compgen -G "$(dirname "$(dirname "$FLINK_PY")")/lib/python3*/site-packages/pyflink/lib/flink-dist-*.jar" >/dev/null
}

# 1. Debian packages. The server headers must match the installed server's
#    version exactly, or apt upgrades the server itself.
server_version=$(dpkg-query -W -f='${Version}' "postgresql-$PG_MAJOR" 2>/dev/null) \
    || die "postgresql-$PG_MAJOR is not installed"
need=()
dev_version=$(dpkg-query -W -f='${Version}' "postgresql-server-dev-$PG_MAJOR" 2>/dev/null || true)
[ "$dev_version" = "$server_version" ] || need+=("postgresql-server-dev-$PG_MAJOR=$server_version")
packages=(libclang-dev clang)
# chromium: the console's browser test drives Debian's (headless, through Playwright).
# nats-server: the NATS JetStream the example external connector reads.
# dpkg-dev: dpkg-shlibdeps, for the packages test (scripts/package.sh).
# buildah, skopeo, umoci, docker-registry: images built, pushed to a real
# registry, read back and unpacked, without a Docker engine (scripts/image.sh).
# openjdk-17-jdk-headless: the Java the Spark and Flink tests' clusters run on,
# and the javac and jar that build the Flink test's job.
[ "$tests" = 1 ] && packages+=(chromium nats-server dpkg-dev buildah skopeo umoci docker-registry openjdk-17-jdk-headless)
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done

# What will be installed, said first.
plan=()
[ ${#need[@]} -gt 0 ] && plan+=("Debian packages: ${need[*]}")
[ "$(cargo pgrx --version 2>/dev/null || true)" = "cargo-pgrx $PGRX_VERSION" ] ||
    plan+=("cargo-pgrx $PGRX_VERSION (compiled: about 2 minutes)")
has 'import pyiceberg, pyarrow, psycopg2' ||
    plan+=("PyIceberg into $(dirname "$(dirname "$PY")") (the quick start reads its tables back with it)")
if [ "$tests" = 1 ]; then
    has 'import moto.server, boto3, standardwebhooks, prometheus_client, nats, duckdb, redis' ||
        plan+=("the tests' Python clients (moto, standardwebhooks, prometheus-client, nats-py, DuckDB, redis-py)")
    "$ST" --version >/dev/null 2>&1 || plan+=("schemathesis into $(dirname "$(dirname "$ST")")")
    "$PW" -c 'import playwright.sync_api' 2>/dev/null || plan+=("playwright into $(dirname "$(dirname "$PW")")")
    has 'import azure.storage.blob, packaging' ||
        plan+=("azure-storage-blob and packaging (the Azure store tests' other clients)")
    [ -x "$AZ/node_modules/.bin/azurite-blob" ] || plan+=("azurite $AZURITE_VERSION (npm) into $AZ")
    "$SPARK_PY" -c 'import pyspark' 2>/dev/null ||
        plan+=("pyspark $PYSPARK_VERSION (Spark's jars, for the Spark test's cluster) into $(dirname "$(dirname "$SPARK_PY")")")
    flink_lib_present ||
        plan+=("apache-flink-libraries $FLINK_VERSION (Flink's jars, for the Flink test's cluster) into $(dirname "$(dirname "$FLINK_PY")")")
fi
if [ ${#plan[@]} -gt 0 ]; then
    say "setup will install:"
    for item in "${plan[@]}"; do say "  $item"; done
fi
if [ ${#need[@]} -gt 0 ]; then
    say "installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    if ! as_root apt-get install -y -q "${need[@]}"; then
        as_root apt-get update -q
        if ! as_root apt-get install -y -q "${need[@]}"; then
            # The server's exact version left the index: take the newest
            # headers and restart the server (minor releases share a format).
            say "postgresql-server-dev-$PG_MAJOR=$server_version is gone; installing the newest"
            need=("${need[@]/postgresql-server-dev-$PG_MAJOR=$server_version/postgresql-server-dev-$PG_MAJOR}")
            as_root apt-get install -y -q "${need[@]}"
            as_root pg_ctlcluster --skip-systemctl-redirect "$PG_MAJOR" main restart || true
        fi
    fi
fi

# 2. The Python and npm clients. They download more than they compute, so
#    they install in the background while cargo builds (steps 3 to 5), and
#    are waited for after step 5. First PyIceberg, the other Iceberg client
#    the quick start and the tests read Orca's tables with.
# Installs pip requirements into the virtualenv of python $1 when the import
# $2 fails there; $3 names them in what setup says.
pip_unless() {
    local py=$1 import=$2 what=$3
    shift 3
    if ! "$py" -c "$import" 2>/dev/null; then
        say "installing $what into $(dirname "$(dirname "$py")")"
        "$py" -m pip install -q "$@"
    fi
}
install_clients() {
    if ! "$PY" -c 'import pyiceberg, pyarrow, psycopg2' 2>/dev/null; then
        say "installing PyIceberg into $(dirname "$(dirname "$PY")")"
        python3 -m venv "$(dirname "$(dirname "$PY")")"
        "$PY" -m pip install -q "pyiceberg[sql-postgres,pyarrow]==0.10.0"
    fi
    # The clients only the tests use.
    if [ "$tests" = 1 ]; then
        # moto's S3 server: the S3 API for the object-store warehouse test (no S3 is
        # reachable from CI).
        pip_unless "$PY" 'import moto.server, boto3' "moto's S3 server" "moto[server]==5.2.5"

        # The Standard Webhooks library, which the webhook test verifies deliveries with.
        pip_unless "$PY" 'import standardwebhooks' "standardwebhooks" "standardwebhooks==1.1.0"
        # schemathesis, which fuzzes orca serve from its OpenAPI document, in a
        # virtualenv of its own (its dependencies and moto's need not agree).
        if ! "$ST" --version >/dev/null 2>&1; then
            say "installing schemathesis into $(dirname "$(dirname "$ST")")"
            python3 -m venv "$(dirname "$(dirname "$ST")")"
            "$(dirname "$ST")/python" -m pip install -q "schemathesis==4.32.5"
        fi
        # Playwright, which drives chromium through the console in its test (no
        # browser download: it launches Debian's /usr/bin/chromium).
        if ! "$PW" -c 'import playwright.sync_api' 2>/dev/null; then
            say "installing playwright into $(dirname "$(dirname "$PW")")"
            python3 -m venv "$(dirname "$(dirname "$PW")")"
            "$PW" -m pip install -q "playwright==1.65.2"
        fi
        # Prometheus' own parser of the text format, which the /metrics test reads with.
        pip_unless "$PY" 'import prometheus_client' "prometheus-client" "prometheus-client==0.26.0"
        # nats-py, which the example NATS JetStream connector (connectors/python)
        # reads with; pyarrow (above) writes its frames.
        pip_unless "$PY" 'import nats' "nats-py" "nats-py==2.16.0"
        # DuckDB and its Iceberg extension (PyPI packages that ship the extension
        # files: nothing is downloaded at run time), which the tests read Orca's
        # partitioned tables with to see them pruned.
        # (One line: an indented second line is a Python syntax error, which made
        # this reinstall DuckDB on every run.)
        pip_unless "$PY" \
            'import duckdb, duckdb_ext, glob, os; assert glob.glob(os.path.join(list(duckdb_ext.__path__)[0], "extensions", "*", "*", "iceberg.duckdb_extension"))' \
            "DuckDB and its Iceberg extension" \
            "duckdb==1.4.4" "duckdb-ext-iceberg==1.4.4.20260205" "duckdb-ext-avro==1.4.4.20260205"
        # Azure Blob Storage, for the store and warehouse tests (no cloud is
        # reachable from CI): azurite (npm) serves Azure's Blob API; the tests
        # read back with azure-storage-blob, and PyIceberg through pyarrow's
        # AzureFileSystem (which needs packaging).
        pip_unless "$PY" 'import azure.storage.blob, packaging' "azure-storage-blob" \
            "azure-storage-blob==12.31.1" "packaging==25.0"
        if [ ! -x "$AZ/node_modules/.bin/azurite-blob" ]; then
            say "installing azurite $AZURITE_VERSION into $AZ"
            mkdir -p "$AZ"
            (cd "$AZ" && npm install -q --no-audit --no-fund --no-save "azurite@$AZURITE_VERSION" >/dev/null)
        fi
        # pyspark, whose package ships Spark's jars and scripts: the Spark test
        # starts a standalone master and worker from them (on Debian's Java 17),
        # in a virtualenv of its own (500 MB; its drivers and workers run on it).
        if ! "$SPARK_PY" -c 'import pyspark' 2>/dev/null; then
            say "installing pyspark $PYSPARK_VERSION into $(dirname "$(dirname "$SPARK_PY")") (about a minute)"
            python3 -m venv "$(dirname "$(dirname "$SPARK_PY")")"
            "$SPARK_PY" -m pip install -q "pyspark==$PYSPARK_VERSION"
        fi
        # Flink's jars, from PyPI's apache-flink-libraries (330 MB; no scripts):
        # the Flink test starts a JobManager and a TaskManager from them on
        # Java 17. Only the jars are wanted, so not its Python dependencies.
        if ! flink_lib_present; then
            say "installing apache-flink-libraries $FLINK_VERSION into $(dirname "$(dirname "$FLINK_PY")") (about a minute)"
            python3 -m venv "$(dirname "$(dirname "$FLINK_PY")")"
            "$FLINK_PY" -m pip install -q --no-deps "apache-flink-libraries==$FLINK_VERSION"
        fi
        # redis-py, which the example Redis destination connector writes with.
        pip_unless "$PY" 'import redis' "redis-py" "redis==8.1.0"
    fi
}
install_clients &
clients=$!

# 3. cargo-pgrx, the same exact version as the pgrx crate.
#    Unoptimised (--debug): it only drives cargo and pg_config, and so builds
#    in 2 minutes on two cores where an optimised build takes 5.
if [ "$(cargo pgrx --version 2>/dev/null || true)" != "cargo-pgrx $PGRX_VERSION" ]; then
    say "installing cargo-pgrx $PGRX_VERSION (about 2 minutes)"
    cargo install cargo-pgrx --version "$PGRX_VERSION" --locked --debug
fi
if ! grep -qs "^pg$PG_MAJOR" "${PGRX_HOME:-$HOME/.pgrx}/config.toml"; then
    say "cargo pgrx init --pg$PG_MAJOR $PG_CONFIG"
    cargo pgrx init "--pg$PG_MAJOR" "$PG_CONFIG"
fi

# 4. The extension, into the system's extension and library directories.
say "building and installing the orca extension (about 2 minutes the first time)"
# Packaged, then each file written beside its place and renamed over it: a
# server that has the old library mapped keeps reading the old file, and
# one that loads it meanwhile finds the old or the new one whole. (`cargo
# pgrx install` writes over the file in place: a server reading a page of
# it then can die of SIGBUS, e.g. setup run again under a live cluster.)
pkg=$(mktemp -d /var/tmp/orca-ext-pkg.XXXXXX)
trap 'as_root rm -rf "$pkg"' EXIT
as_root env "PATH=$PATH" "CARGO_TARGET_DIR=$CARGO_TARGET_DIR" "HOME=$HOME" \
    cargo pgrx package -p orca-ext --pg-config "$PG_CONFIG" --out-dir "$pkg" >/dev/null
libdir="$("$PG_CONFIG" --pkglibdir)"
extdir="$("$PG_CONFIG" --sharedir)/extension"
put() { # put MODE FILE DIR
    as_root install -m "$1" "$2" "$3/.$(basename "$2").new"
    as_root mv -f "$3/.$(basename "$2").new" "$3/$(basename "$2")"
}
[ -f "$pkg$libdir/orca.so" ] || die "cargo pgrx package left no orca.so in $pkg$libdir"
put 0755 "$pkg$libdir/orca.so" "$libdir"
[ -f "$pkg$extdir/orca.control" ] || die "cargo pgrx package left no orca.control in $pkg$extdir"
for f in "$pkg$extdir/"orca*; do
    put 0644 "$f" "$extdir"
done
as_root rm -rf "$pkg"
trap - EXIT
# Released install scripts of older versions and upgrade scripts, so that an
# old install can be created and upgraded.
current=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
for f in migrations/orca--*.sql; do
    [ -e "$f" ] || continue
    [ "$(basename "$f")" = "orca--$current.sql" ] && continue
    as_root install -m 0644 "$f" "$extdir/"
done

# 5. The library of each older release, built once from the commit
#    migrations/RELEASES names, for the upgrade test (tests/tests/upgrade.rs),
#    which starts a server on the old library and installs this build's
#    under it. A target directory of its own, so this build's stays as it is.
releases_dir="${ORCA_RELEASES_DIR:-/var/tmp/orca-releases}"
[ "$tests" = 1 ] && while read -r v _sum commit; do
    case "$v" in '' | \#*) continue ;; esac
    [ "$v" = "$current" ] && continue
    out="$releases_dir/$v"
    if [ -f "$out/orca.so" ] && [ "$(cat "$out/commit" 2>/dev/null)" = "$commit" ]; then
        continue
    fi
    if ! git cat-file -e "$commit^{commit}" 2>/dev/null; then
        say "warning: release $v's commit $commit is not in this clone: the upgrade test cannot start on its library"
        continue
    fi
    say "building release $v's library from $commit (once; about 3 minutes)"
    src=$(mktemp -d /var/tmp/orca-release-src.XXXXXX)
    git archive "$commit" | tar -x -C "$src"
    (cd "$src" && CARGO_TARGET_DIR="${CARGO_TARGET_DIR}-releases" \
        cargo pgrx package -p orca-ext --pg-config "$PG_CONFIG" --out-dir "$src/pkg" >/dev/null)
    lib=$(find "$src/pkg" -name orca.so | head -1)
    [ -n "$lib" ] || die "the build of release $v made no orca.so"
    mkdir -p "$out"
    install -m 0755 "$lib" "$out/orca.so"
    echo "$commit" >"$out/commit"
    rm -rf "$src"
done <migrations/RELEASES
wait "$clients" || die "installing the Python and npm clients failed (their output is above)"

# 6. The system cluster, which the tests use and the extension is installed for.
if ! pg_isready -q -h 127.0.0.1 -p 5432; then
    say "starting PostgreSQL $PG_MAJOR"
    as_root pg_ctlcluster --skip-systemctl-redirect "$PG_MAJOR" main start
fi
# What the tests need of this machine besides.
if [ "$tests" = 1 ]; then
    # The postgres_cdc source reads changes by logical replication, which the
    # tests do against this cluster: it needs wal_level = logical (a restart).
    if [ "$(as_postgres psql -Atq -h 127.0.0.1 -U postgres -d postgres -c 'SHOW wal_level')" != logical ]; then
        say "setting wal_level = logical (logical replication, for the CDC source) and restarting"
        as_postgres psql -q -h 127.0.0.1 -U postgres -d postgres -v ON_ERROR_STOP=1 \
            -c "ALTER SYSTEM SET wal_level = logical" >/dev/null
        as_root pg_ctlcluster --skip-systemctl-redirect "$PG_MAJOR" main restart
    fi
    # NATS with JetStream, which the example external connector reads in the
    # tests (Debian's nats-server; started as the machine's notes start it).
    if ! (exec 3<>/dev/tcp/127.0.0.1/4222) 2>/dev/null; then
        if [ -x /usr/sbin/nats-server ]; then
            # Debian's package may have started its own service: ours has JetStream.
            say "starting nats-server (JetStream) on 127.0.0.1:4222"
            as_root mkdir -p /var/lib/nats-server
            as_root start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- \
                -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log
            for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/4222) 2>/dev/null && break; sleep 0.1; done
        else
            say "no nats-server: the external connector test needs NATS JetStream on 127.0.0.1:4222"
        fi
    fi
    # Redis, which the example destination connector writes to in the tests.
    if ! (exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null; then
        if command -v redis-server >/dev/null; then
            say "starting redis-server on 127.0.0.1:6379"
            as_root redis-server --bind 127.0.0.1 --port 6379 --daemonize yes --save '' >/dev/null
            for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null && break; sleep 0.1; done
        else
            say "no redis-server: the destination connector test needs Redis on 127.0.0.1:6379"
        fi
    fi
fi
# 7. The installation key for secrets (docs/security.md): 32 random bytes as
# hex in a file only the server's user reads, outside the database; made once.
KEY_FILE="${ORCA_SECRETS_KEY_FILE:-/var/lib/postgresql/orca/secrets.key}"
if [ ! -s "$KEY_FILE" ]; then
    say "making the installation key for secrets: $KEY_FILE"
    as_root install -d -o postgres -g postgres -m 700 "$(dirname "$KEY_FILE")"
    as_root sh -c "umask 077; head -c 32 /dev/urandom | od -An -v -tx1 | tr -d ' \n' > '$KEY_FILE'"
    as_root chown postgres:postgres "$KEY_FILE"
fi
as_postgres psql -q -h 127.0.0.1 -U postgres -d postgres -v ON_ERROR_STOP=1 \
    -c "LOAD 'orca'" -c "ALTER SYSTEM SET orca.secrets_key_file = '$KEY_FILE'" \
    -c "SELECT pg_reload_conf()" >/dev/null
say "setup done: extension orca $current installed for PostgreSQL $PG_MAJOR$([ "$tests" = 1 ] && echo ', with what the tests need')"
