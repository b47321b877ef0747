# Shared settings for the scripts; sourced, not run.
export PG_MAJOR="${PG_MAJOR:-15}"
export PG_CONFIG="${PG_CONFIG:-/usr/lib/postgresql/$PG_MAJOR/bin/pg_config}"
# A build directory outside the clone, so that CI's fresh clones reuse the build.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/orca-target}"
export PGRX_VERSION="0.18.1"
export PATH="$HOME/.cargo/bin:$PATH"
ORCA_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export ORCA_ROOT
say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
# Runs a command as the postgres OS user when we are root (PostgreSQL refuses root).
as_postgres() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
