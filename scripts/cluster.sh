# A private PostgreSQL cluster with the orca extension preloaded; sourced by
# the demo. Runs as the postgres OS user when we are root.
# Needs: env.sh sourced; ORCA_PGDIR (where it lives), ORCA_PGPORT.

pg_bin() { echo "$("$PG_CONFIG" --bindir)/$1"; }

cluster_url() { echo "postgres://postgres@127.0.0.1:$ORCA_PGPORT/${1:-orca}"; }

cluster_running() {
    [ -f "$ORCA_PGDIR/data/postmaster.pid" ] &&
        as_postgres "$(pg_bin pg_ctl)" -D "$ORCA_PGDIR/data" status >/dev/null 2>&1
}

cluster_start() {
    if [ ! -f "$ORCA_PGDIR/data/PG_VERSION" ]; then
        say "creating a private PostgreSQL cluster in $ORCA_PGDIR (port $ORCA_PGPORT)"
        mkdir -p "$ORCA_PGDIR"
        [ "$(id -u)" = 0 ] && chown postgres:postgres "$ORCA_PGDIR"
        as_postgres "$(pg_bin initdb)" -D "$ORCA_PGDIR/data" -U postgres --auth=trust -E UTF8 \
            --no-sync >/dev/null
        as_postgres tee -a "$ORCA_PGDIR/data/postgresql.auto.conf" >/dev/null <<CONF
port = $ORCA_PGPORT
listen_addresses = '127.0.0.1'
unix_socket_directories = '$ORCA_PGDIR'
shared_preload_libraries = 'orca'
orca.databases = 'orca'
orca.tick_ms = 1000
CONF
    fi
    if cluster_running; then
        # A preloaded library stays loaded: restart to pick up a new build.
        say "restarting the private cluster to load the installed extension"
        as_postgres "$(pg_bin pg_ctl)" -D "$ORCA_PGDIR/data" -m fast -w restart \
            -l "$ORCA_PGDIR/server.log" >/dev/null
    else
        say "starting the private cluster on port $ORCA_PGPORT"
        as_postgres "$(pg_bin pg_ctl)" -D "$ORCA_PGDIR/data" -w -l "$ORCA_PGDIR/server.log" \
            start >/dev/null
    fi
}

cluster_stop() {
    if cluster_running; then
        as_postgres "$(pg_bin pg_ctl)" -D "$ORCA_PGDIR/data" -m fast -w stop >/dev/null
    fi
}
