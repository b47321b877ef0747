-- Change data capture: the replication slot (and publication) each
-- postgres_cdc sync owns, how far behind it is, and dropping a sync, which
-- lets its slot go.

-- The slot (and publication) of a sync, named as orca-engine names it
-- (orca_core::sync::cdc_slot): the sync's name, then a hash of this control
-- plane's database, the org and the sync, so that no two syncs share one.
CREATE FUNCTION orca._cdc_slot(p_org bigint, p_sync text) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT 'orca_' || left(p_sync, 40) || '_'
           || encode(substr(sha256(convert_to(current_database(), 'UTF8') || '\x00'::bytea
                                   || convert_to(o.name, 'UTF8') || '\x00'::bytea
                                   || convert_to(p_sync, 'UTF8') || '\x00'::bytea), 1, 8), 'hex')
    FROM orca.orgs o WHERE o.id = p_org
$$;

-- How the slot of a sync whose source is another server stands, as the
-- source pump of the sync's attempt measured it there and its runner
-- reported it (orca.report_slot): the tick sees only its own server's
-- slots. One row per sync, the latest measure.
CREATE TABLE orca.sync_slots (
    sync_id             bigint PRIMARY KEY REFERENCES orca.syncs (id) ON DELETE CASCADE,
    org_id              bigint NOT NULL REFERENCES orca.orgs (id),
    slot                text NOT NULL,
    wal_status          text CHECK (wal_status IN ('reserved', 'extended', 'unreserved', 'lost')),
    safe_wal_size       bigint,
    lag_bytes           bigint,
    retained_bytes      bigint,
    confirmed_flush_lsn pg_lsn,
    measured_at         timestamptz NOT NULL,
    reported_at         timestamptz NOT NULL DEFAULT now(),
    attempt_id          bigint NOT NULL
);
COMMENT ON TABLE orca.sync_slots IS
'The latest measure of each change stream''s slot on its source server, taken by the source pump '
'of the sync''s attempt (every 10 s while it reads) and reported by its runner at a heartbeat '
'(orca.report_slot): wal_status, safe_wal_size, lag_bytes and retained_bytes as the source''s '
'pg_replication_slots has them, measured_at on the source''s clock. The tick judges cdc_lag and '
'slot_at_risk by it when the slot is not on the control plane''s own server. Nothing measures a '
'sync no attempt reads (paused, or between runs): its last measure stands.';
ALTER TABLE orca.sync_slots ENABLE ROW LEVEL SECURITY;
CREATE POLICY org_scope ON orca.sync_slots USING (org_id = (SELECT orca.current_org_id()));
SELECT pg_catalog.pg_extension_config_dump('orca.sync_slots', '');

CREATE VIEW orca.cdc_slots WITH (security_invoker = true) AS
SELECT sy.id                                                   AS sync_id,
       o.name                                                  AS org,
       sy.name                                                 AS sync,
       x.slot,
       rs.slot_name IS NOT NULL                                AS on_this_server,
       rs.active,
       CASE WHEN rs.slot_name IS NULL THEN m.confirmed_flush_lsn
            ELSE rs.confirmed_flush_lsn END                    AS confirmed_flush_lsn,
       v.lag_bytes,
       CASE WHEN v.lag_bytes > 0
            THEN extract(epoch FROM now() - coalesce(sy.head_at, sy.created_at))::bigint
            ELSE 0 END                                          AS lag_seconds,
       CASE WHEN rs.slot_name IS NULL THEN m.retained_bytes
            ELSE pg_wal_lsn_diff(pg_current_wal_lsn(), rs.restart_lsn)::bigint END
                                                               AS retained_bytes,
       CASE WHEN rs.slot_name IS NULL THEN m.wal_status ELSE rs.wal_status END AS wal_status,
       -- Nothing will read the slot again unless someone acts: the sync is
       -- paused, or has no schedule and no run of its own queued or running
       -- (a discovery or maintenance run reads no slot).
       (rs.slot_name IS NOT NULL AND NOT rs.active
        AND pg_wal_lsn_diff(pg_current_wal_lsn(), rs.restart_lsn) > 0
        AND (coalesce(p.paused, true)
             OR (sy.definition->>'schedule' IS NULL
                 AND NOT EXISTS (SELECT 1 FROM orca.runs r
                                 WHERE r.pipeline_id = p.id AND r.kind = 'sync'
                                   AND r.status IN ('queued', 'running')))))
                                                               AS held_back,
       CASE WHEN rs.slot_name IS NULL THEN m.safe_wal_size ELSE rs.safe_wal_size END
                                                               AS safe_wal_size,
       -- When the values of a slot on another server were measured there.
       CASE WHEN rs.slot_name IS NULL THEN m.measured_at END   AS measured_at
FROM orca.syncs sy
JOIN orca.orgs o ON o.id = sy.org_id
-- orca._cdc_slot's name, spelled out: the view runs as its reader.
CROSS JOIN LATERAL (
    SELECT 'orca_' || left(sy.name, 40) || '_'
           || encode(substr(sha256(convert_to(current_database(), 'UTF8') || '\x00'::bytea
                                   || convert_to(o.name, 'UTF8') || '\x00'::bytea
                                   || convert_to(sy.name, 'UTF8') || '\x00'::bytea), 1, 8), 'hex')
           AS slot) x
LEFT JOIN orca.pipelines p ON p.org_id = sy.org_id AND p.name = sy.name
LEFT JOIN pg_replication_slots rs ON rs.slot_name = x.slot
LEFT JOIN orca.sync_slots m ON m.sync_id = sy.id AND m.slot = x.slot
-- This server's slot, measured now, else the last report from the source's.
CROSS JOIN LATERAL (
    SELECT CASE WHEN rs.slot_name IS NULL THEN m.lag_bytes
                ELSE pg_wal_lsn_diff(pg_current_wal_lsn(), rs.confirmed_flush_lsn)::bigint END
           AS lag_bytes) v
WHERE sy.definition->'source'->>'type' = 'postgres_cdc';
COMMENT ON VIEW orca.cdc_slots IS
'One row per postgres_cdc sync: its replication slot, whether this server holds it, whether a '
'session reads it, how far its confirmed position is behind the WAL (lag_bytes; lag_seconds since '
'HEAD last moved while there is lag), how much WAL it keeps (retained_bytes), held_back: a slot '
'nothing will read again unless someone acts (the sync paused, or unscheduled with no run), which '
'pins WAL, and safe_wal_size: WAL left before the server may invalidate it. A slot on another '
'server shows the last measure its sync''s runner reported (orca.sync_slots), taken there at '
'measured_at; for it active is null and held_back is false.';

-- For runners: the source pump of a change stream's attempt measures the
-- sync's slot on the source server (pg_replication_slots there) and its
-- runner reports the latest measure at a heartbeat.
CREATE FUNCTION orca.report_slot(lease uuid, measured jsonb) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('report_slot', 'measured', octet_length(report_slot.measured::text), 4096);
    t      orca.runner_tokens := orca._runner_session();
    v_org  bigint := t.org_id;
    a      orca.attempts;
    y      orca.syncs;
    v_slot text;
    v_key  text;
    v_num  jsonb;
    v_bad  boolean;
    v_at   timestamptz;
    v_lsn  pg_lsn;
BEGIN
    PERFORM orca._lease_holder(t, report_slot.lease);
    a := orca._leased_attempt(v_org, report_slot.lease);
    SELECT s.* INTO y
    FROM orca.runs r
    JOIN orca.pipelines p ON p.id = r.pipeline_id
    JOIN orca.syncs s ON s.org_id = p.org_id AND s.name = p.name
    WHERE r.id = a.run_id;
    IF y.id IS NULL OR y.definition -> 'source' ->> 'type' IS DISTINCT FROM 'postgres_cdc' THEN
        RAISE EXCEPTION 'attempt % is not one of a change stream (a postgres_cdc sync): it has no slot to report',
                        a.id
            USING ERRCODE = 'OR050';
    END IF;
    v_slot := orca._cdc_slot(y.org_id, y.name);
    IF jsonb_typeof(report_slot.measured) IS DISTINCT FROM 'object'
       OR report_slot.measured ->> 'slot' IS DISTINCT FROM v_slot THEN
        RAISE EXCEPTION 'measured must be an object whose slot is the sync''s slot %, got %',
                        v_slot, left(coalesce(report_slot.measured ->> 'slot', report_slot.measured::text, 'NULL'), 200)
            USING ERRCODE = 'OR050';
    END IF;
    IF coalesce(report_slot.measured ->> 'wal_status', 'reserved')
       NOT IN ('reserved', 'extended', 'unreserved', 'lost') THEN
        RAISE EXCEPTION 'measured.wal_status must be reserved, extended, unreserved or lost, got %',
                        quote_literal(left(report_slot.measured ->> 'wal_status', 200))
            USING ERRCODE = 'OR050';
    END IF;
    FOREACH v_key IN ARRAY ARRAY['safe_wal_size', 'lag_bytes', 'retained_bytes'] LOOP
        v_num := coalesce(report_slot.measured -> v_key, 'null');
        -- A number is cast only once it is known to be one.
        v_bad := jsonb_typeof(v_num) NOT IN ('number', 'null');
        IF NOT v_bad AND jsonb_typeof(v_num) = 'number' THEN
            v_bad := v_num::numeric <> trunc(v_num::numeric)
                     OR abs(v_num::numeric) > 9223372036854775807;
        END IF;
        IF v_bad THEN
            RAISE EXCEPTION 'measured.% must be a whole number of bytes or null, got %',
                            v_key, left(v_num::text, 200)
                USING ERRCODE = 'OR050';
        END IF;
    END LOOP;
    IF coalesce(jsonb_typeof(report_slot.measured -> 'absent'), 'null') NOT IN ('boolean', 'null') THEN
        RAISE EXCEPTION 'measured.absent must be true, false or null, got %',
                        left((report_slot.measured -> 'absent')::text, 200)
            USING ERRCODE = 'OR050';
    END IF;
    BEGIN
        v_at := (report_slot.measured ->> 'measured_at')::timestamptz;
        v_lsn := (report_slot.measured ->> 'confirmed_flush_lsn')::pg_lsn;
    EXCEPTION WHEN data_exception THEN
        v_at := NULL;
    END;
    IF v_at IS NULL OR NOT isfinite(v_at) THEN
        RAISE EXCEPTION 'measured.measured_at must be a time and confirmed_flush_lsn an LSN or null, got % and %',
                        coalesce(left(report_slot.measured ->> 'measured_at', 200), 'NULL'),
                        coalesce(left(report_slot.measured ->> 'confirmed_flush_lsn', 200), 'NULL')
            USING ERRCODE = 'OR050';
    END IF;
    -- A slot gone from its server has no measure to judge; a slot of this
    -- server is measured by the tick itself, never by an older report.
    IF coalesce((report_slot.measured ->> 'absent')::boolean, false)
       OR EXISTS (SELECT 1 FROM pg_replication_slots rs WHERE rs.slot_name = v_slot) THEN
        DELETE FROM orca.sync_slots ss WHERE ss.sync_id = y.id;
        RETURN;
    END IF;
    -- Only the attempt that holds the sync's lease reports: the last
    -- report is the newest measure.
    INSERT INTO orca.sync_slots AS ss (sync_id, org_id, slot, wal_status, safe_wal_size, lag_bytes,
                                       retained_bytes, confirmed_flush_lsn, measured_at, attempt_id)
    VALUES (y.id, y.org_id, v_slot, report_slot.measured ->> 'wal_status',
            (report_slot.measured -> 'safe_wal_size')::numeric::bigint,
            (report_slot.measured -> 'lag_bytes')::numeric::bigint,
            (report_slot.measured -> 'retained_bytes')::numeric::bigint,
            v_lsn, least(v_at, now()), a.id)
    ON CONFLICT (sync_id) DO UPDATE
    SET slot = EXCLUDED.slot, wal_status = EXCLUDED.wal_status,
        safe_wal_size = EXCLUDED.safe_wal_size, lag_bytes = EXCLUDED.lag_bytes,
        retained_bytes = EXCLUDED.retained_bytes,
        confirmed_flush_lsn = EXCLUDED.confirmed_flush_lsn, measured_at = EXCLUDED.measured_at,
        reported_at = now(), attempt_id = EXCLUDED.attempt_id;
END
$$;
COMMENT ON FUNCTION orca.report_slot(uuid, jsonb) IS
'For runners: records how the slot of the leased change stream''s sync stands on its source '
'server (orca.sync_slots), as the attempt''s source pump measured it there: {slot, wal_status, '
'safe_wal_size, lag_bytes, retained_bytes, confirmed_flush_lsn, measured_at, absent}. The tick '
'judges cdc_lag and slot_at_risk of a slot on another server by it; a slot absent there, or one '
'on this server (which the tick measures itself), leaves no row. Errors: OR050 (the attempt is '
'not a change stream''s, another slot, a malformed value), OR051 (over 4 KiB), and the lease''s '
'errors as for orca.heartbeat (OR012, OR014, OR015, OR080, OR082).';

CREATE FUNCTION orca.drop_sync(name text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('drop_sync', 'name', octet_length(drop_sync.name), 1024);
    v_org    bigint := orca.current_org_id();
    s        orca.syncs;
    v_pid    bigint;
    v_open   bigint;
    v_slot   text;
    v_active boolean;
    v_state  text;
BEGIN
    s := orca._sync(v_org, drop_sync.name);
    SELECT p.id INTO v_pid FROM orca.pipelines p
    WHERE p.org_id = v_org AND p.name = s.name FOR UPDATE;
    SELECT min(r.id) INTO v_open FROM orca.runs r
    WHERE r.pipeline_id = v_pid AND r.status IN ('queued', 'running');
    IF v_open IS NOT NULL THEN
        RAISE EXCEPTION 'sync ''%'' has run % queued or running', s.name, v_open
            USING ERRCODE = 'OR066',
                  HINT = format('cancel it (SELECT orca.cancel(%s)), let it stop, then drop the sync',
                                v_open);
    END IF;
    IF s.definition->'source'->>'type' = 'postgres_cdc' THEN
        v_slot := orca._cdc_slot(v_org, s.name);
        SELECT rs.active INTO v_active FROM pg_replication_slots rs WHERE rs.slot_name = v_slot;
        IF NOT FOUND THEN
            v_state := 'not on this server';
            RAISE NOTICE 'replication slot % of sync ''%'' is not on this server; if the source is another, drop it there: SELECT pg_drop_replication_slot(%)',
                         v_slot, s.name, quote_literal(v_slot);
        ELSIF v_active THEN
            RAISE EXCEPTION 'replication slot % of sync ''%'' is held by a live session', v_slot, s.name
                USING ERRCODE = 'OR067',
                      HINT = 'an attempt that was killed leaves it within wal_sender_timeout; try again then';
        ELSE
            PERFORM pg_drop_replication_slot(v_slot);
            v_state := 'dropped';
        END IF;
        IF EXISTS (SELECT 1 FROM pg_publication pb WHERE pb.pubname = v_slot) THEN
            EXECUTE format('DROP PUBLICATION %I', v_slot);
        END IF;
    END IF;
    -- The pipeline and its runs stay (history); it is paused and keeps the
    -- sync's generation and HEAD, so that a sync defined again under the
    -- name continues them and its destination's fence and markers hold.
    DELETE FROM orca.schedules WHERE pipeline_id = v_pid;
    UPDATE orca.pipelines
    SET paused = true, sync_generation = s.generation, sync_epoch = s.head_epoch
    WHERE id = v_pid;
    DELETE FROM orca.syncs WHERE id = s.id;
    PERFORM orca._event(v_org, 'sync.dropped', v_pid, NULL, NULL,
        jsonb_build_object('sync', s.name, 'generation', s.generation, 'head_epoch', s.head_epoch,
                           'slot', v_slot, 'slot_state', v_state, 'by', session_user));
END
$$;
COMMENT ON FUNCTION orca.drop_sync(text) IS
'Drops a sync: its definition and HEAD go (its runs stay, under its paused pipeline), and a '
'postgres_cdc sync''s replication slot and publication are dropped when this server holds them '
'(a notice names a slot on another server, to drop there). A sync defined again under the name '
'continues its generation and epochs, so its destination''s fence and markers hold; a CDC sync '
'starts with a new snapshot. Errors: OR064 unknown sync, OR066 a run is queued or running '
'(cancel it first), OR067 the slot is held by a live session. '
'Example: SELECT orca.drop_sync(''shop'');';

-- A continuous sync's run, started unless one is queued or running (or the
-- sync is paused): one long-lived run per sync. Only the sync's own runs
-- count: a discovery or maintenance run of its pipeline moves no rows.
CREATE FUNCTION orca._keep_running(p_org bigint, p_sync text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    p orca.pipelines;
BEGIN
    SELECT * INTO p FROM orca.pipelines WHERE org_id = p_org AND name = p_sync;
    IF p.paused OR EXISTS (SELECT 1 FROM orca.runs r
                           WHERE r.pipeline_id = p.id AND r.kind = 'sync'
                             AND r.status IN ('queued', 'running')) THEN
        RETURN NULL;
    END IF;
    RETURN orca.run(p_sync, 'now');
END
$$;

-- The supervisor of continuous syncs (a phase of orca.tick): a continuous
-- sync that is not paused and has no queued or running run gets a new one
-- (its own runs, kind 'sync': a discovery or maintenance run of its
-- pipeline neither holds a restart back nor stands for its last run),
-- once its last run ended (failed with its retries spent, or succeeded: an
-- engine that stopped) and a backoff passed: 10 s after one failed run (or a
-- succeeded one), doubling with each failed run in a row, at most 10
-- minutes. A run
-- cancelled by hand is left alone (orca.resume_sync starts it again).
-- A continuous sync's failed runs in a row (since the last run that did not
-- fail) and the backoff before its next run: _tick_continuous waits it out,
-- orca.explain says until when.
CREATE FUNCTION orca._continuous_backoff(p_pipeline bigint, OUT failed integer,
                                         OUT backoff_seconds integer)
LANGUAGE sql STABLE AS $$
    SELECT n::integer, least(600, 10 * (2 ^ greatest(n - 1, 0))::integer)
    FROM (SELECT count(*) AS n FROM orca.runs r
          WHERE r.pipeline_id = p_pipeline AND r.kind = 'sync' AND r.status = 'failed'
            AND r.id > coalesce((SELECT max(x.id) FROM orca.runs x
                                 WHERE x.pipeline_id = p_pipeline AND x.kind = 'sync'
                                   AND x.status <> 'failed'), 0)) f
$$;

CREATE FUNCTION orca._tick_continuous(p_orgs bigint[], p_now timestamptz) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    c         record;
    v_run     bigint;
    v_failed  integer;
    v_backoff integer;
    n         integer := 0;
BEGIN
    FOR c IN
        SELECT p.org_id, p.id AS pipeline_id, p.name, p.current_version,
               last.status AS last_status, last.finished_at AS last_finished
        FROM orca.syncs y
        JOIN orca.pipelines p ON p.org_id = y.org_id AND p.name = y.name
        LEFT JOIN LATERAL (SELECT r.status,
                                  coalesce(r.finished_at, r.started_at, r.created_at) AS finished_at
                           FROM orca.runs r
                           WHERE r.pipeline_id = p.id AND r.kind = 'sync'
                           ORDER BY r.id DESC LIMIT 1) last ON true
        WHERE y.org_id = ANY (p_orgs)
          AND (y.definition -> 'source' ->> 'continuous') = 'true'
          AND NOT p.paused
          AND last.status IN ('failed', 'succeeded')
          AND NOT EXISTS (SELECT 1 FROM orca.runs r
                          WHERE r.pipeline_id = p.id AND r.kind = 'sync'
                            AND r.status IN ('queued', 'running'))
        ORDER BY p.org_id, p.id
        FOR UPDATE OF p SKIP LOCKED
    LOOP
        SELECT b.failed, b.backoff_seconds INTO v_failed, v_backoff
        FROM orca._continuous_backoff(c.pipeline_id) b;
        CONTINUE WHEN c.last_finished + make_interval(secs => v_backoff) > p_now;
        INSERT INTO orca.runs (org_id, pipeline_id, version_id, partitions, trigger, run_retries, kind)
        SELECT c.org_id, c.pipeline_id, v.id,
               ARRAY[orca._fire_partition_of('sync', '', '', 'UTC', p_now)],
               'manual', v.run_retries, 'sync'
        FROM orca.pipeline_versions v WHERE v.id = c.current_version
        RETURNING id INTO v_run;
        PERFORM orca._runs_created(c.org_id, c.pipeline_id, ARRAY[v_run]);
        PERFORM orca._event(c.org_id, 'sync.restarted', c.pipeline_id, v_run, NULL,
                            jsonb_build_object('sync', c.name, 'after', c.last_status,
                                               'failed_runs', v_failed,
                                               'backoff_seconds', v_backoff));
        n := n + 1;
    END LOOP;
    RETURN jsonb_build_object('continuous_restarted', n);
END
$$;

CREATE FUNCTION orca.pause_sync(name text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('pause_sync', 'name', octet_length(pause_sync.name), 1024);
    v_org bigint := orca.current_org_id();
    s     orca.syncs;
    r     bigint;
BEGIN
    s := orca._sync(v_org, pause_sync.name);
    PERFORM orca.pause(s.name);
    -- A running attempt stops at its next epoch boundary (a resume point):
    -- its runner hears of the cancel at its next heartbeat.
    FOR r IN SELECT x.id FROM orca.runs x JOIN orca.pipelines p ON p.id = x.pipeline_id
             WHERE p.org_id = v_org AND p.name = s.name AND x.status IN ('queued', 'running')
             ORDER BY x.id
    LOOP
        PERFORM orca.cancel(r);
    END LOOP;
    PERFORM orca._event(v_org, 'sync.paused', NULL, NULL, NULL,
                        jsonb_build_object('sync', s.name, 'head_epoch', s.head_epoch,
                                           'by', session_user));
END
$$;
COMMENT ON FUNCTION orca.pause_sync(text) IS
'Pauses a sync: its schedule makes no runs, and its queued and running runs are cancelled; a '
'running attempt stops at its next epoch boundary with everything before it committed. '
'orca.resume_sync starts it again from HEAD. Errors: OR064 unknown sync. '
'Example: SELECT orca.pause_sync(''shop'');';

CREATE FUNCTION orca.resume_sync(name text) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('resume_sync', 'name', octet_length(resume_sync.name), 1024);
    v_org bigint := orca.current_org_id();
    s     orca.syncs;
    v_run bigint;
BEGIN
    s := orca._sync(v_org, resume_sync.name);
    PERFORM orca.unpause(s.name);
    IF (s.definition->'source'->>'continuous')::boolean IS TRUE THEN
        v_run := orca._keep_running(v_org, s.name);
    END IF;
    PERFORM orca._event(v_org, 'sync.resumed', NULL, v_run, NULL,
                        jsonb_build_object('sync', s.name, 'by', session_user));
    RETURN v_run;
END
$$;
COMMENT ON FUNCTION orca.resume_sync(text) IS
'Resumes a paused sync from its HEAD: its schedule makes runs again, and a continuous sync '
'gets its long-lived run back (returned; NULL when one is already queued or running, or for '
'a scheduled sync). Errors: OR064 unknown sync. Example: SELECT orca.resume_sync(''shop'');';

-- Scaling: a sync's writer lanes change in its definition, in place. A
-- continuous attempt follows them at its next epoch boundary
-- (orca.sync_lanes), so its run, its change stream and its slot position
-- go on; a scheduled sync's next run takes them.
-- Sets a sync's writer lanes (checked by the caller): orca.scale_sync, and
-- the scale_sync playbook. Returns the lanes it had.
CREATE FUNCTION orca._scale_sync(p_org bigint, s orca.syncs, p_lanes integer, p_by text)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_was integer := coalesce((s.definition->'destination'->>'lanes')::integer, 1);
    v     orca.pipeline_versions;
    d     jsonb;
BEGIN
    IF v_was = p_lanes THEN
        RETURN v_was;
    END IF;
    d := jsonb_set(s.definition, '{destination,lanes}', to_jsonb(p_lanes));
    UPDATE orca.syncs x SET definition = d WHERE x.id = s.id;
    -- The pipeline's version carries the definition too (what orca.runs
    -- shows a run was made from): a new one, same schedule, pool, retries.
    SELECT pv.* INTO v FROM orca.pipeline_versions pv JOIN orca.pipelines p
        ON p.current_version = pv.id
    WHERE p.org_id = p_org AND p.name = s.name;
    IF FOUND THEN
        PERFORM orca._sync_pipeline(p_org, s.name, d, v.cron, v.pool, v.run_retries);
    END IF;
    PERFORM orca._event(p_org, 'sync.scaled',
        (SELECT p.id FROM orca.pipelines p WHERE p.org_id = p_org AND p.name = s.name), NULL, NULL,
        jsonb_build_object('sync', s.name, 'lanes', p_lanes, 'was', v_was, 'by', p_by));
    RETURN v_was;
END
$$;

CREATE FUNCTION orca.scale_sync(name text, lanes integer) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('scale_sync', 'name', octet_length(scale_sync.name), 1024);
    v_org  bigint := orca.current_org_id();
    s      orca.syncs;
    v_kind text;
BEGIN
    s := orca._sync(v_org, scale_sync.name);
    v_kind := s.definition->'destination'->>'type';
    IF v_kind NOT IN ('parquet', 'iceberg', 'postgres') THEN
        RAISE EXCEPTION 'sync ''%'' writes to a % destination, which has no writer lanes',
                        s.name, quote_nullable(v_kind)
            USING ERRCODE = 'OR063',
                  HINT = 'parquet, iceberg and postgres destinations take lanes';
    END IF;
    IF scale_sync.lanes IS NULL OR scale_sync.lanes NOT BETWEEN 1 AND 64 THEN
        RAISE EXCEPTION 'lanes must be a number of writer lanes from 1 to 64, got %',
                        coalesce(scale_sync.lanes::text, 'NULL')
            USING ERRCODE = 'OR063';
    END IF;
    RETURN orca._scale_sync(v_org, s, scale_sync.lanes, session_user);
END
$$;
COMMENT ON FUNCTION orca.scale_sync(text, integer) IS
'Sets a sync''s writer lanes (1 to 64; parquet, iceberg and postgres destinations) and returns '
'the lanes it had. Nothing stops: a continuous sync''s running attempt takes the new lanes at '
'its next epoch boundary (its run, change stream and HEAD go on), a scheduled sync''s next '
'run takes them. Every epoch is recorded with its own lanes'' files, so recovery is unchanged. '
'Event sync.scaled. Errors: OR064 unknown sync, OR063 lanes out of range or a destination '
'without lanes. Example: SELECT orca.scale_sync(''orders_cdc'', 4);';

CREATE FUNCTION orca.sync_lanes(sync text, generation integer, lease uuid DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('sync_lanes', 'sync', octet_length(sync_lanes.sync), 1024);
    a     orca.attempts := orca._sync_caller(sync_lanes.sync, sync_lanes.lease, 'scaling');
    s     orca.syncs := orca._sync(a.org_id, sync_lanes.sync);
BEGIN
    PERFORM orca._owned(s, sync_lanes.generation);
    RETURN (s.definition->'destination'->>'lanes')::integer;
END
$$;
COMMENT ON FUNCTION orca.sync_lanes(text, integer, uuid) IS
'The writer lanes a sync''s definition asks for now (NULL: none named, one lane), for the '
'attempt of the given generation under its lease: a continuous attempt asks between epochs '
'and follows orca.scale_sync. Errors: OR084 no lease, OR012 a lease not of this org, OR070 '
'a fenced generation.';
