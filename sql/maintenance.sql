-- Table maintenance: runs of kind 'maintain' that expire a dataset's old
-- snapshots, remove its orphan files and compact its small files. The
-- control plane reads no table, so a runner's orca-engine does the work
-- (`orca-engine maintain`); what it may never touch comes from here: the
-- snapshots runs have pinned and those sensors have yet to see.

CREATE TABLE orca.maintenance (
    org_id      bigint NOT NULL REFERENCES orca.orgs (id),
    dataset     text NOT NULL,
    -- What each run does (orca._maintenance_options normalized it).
    options     jsonb NOT NULL,
    cron        text NOT NULL,
    tz          text NOT NULL,
    -- The next fire, and the run the last fire (or orca.maintain) queued.
    next_fire_at timestamptz,
    last_run    bigint,
    created_at  timestamptz NOT NULL DEFAULT now(),
    created_by  name NOT NULL DEFAULT session_user,
    PRIMARY KEY (org_id, dataset)
);
COMMENT ON TABLE orca.maintenance IS
'Scheduled table maintenance (orca.schedule_maintenance): per dataset, the options each run '
'takes (expire, orphans, compact), its cron and time zone, the next fire and the last run.';
ALTER TABLE orca.maintenance ENABLE ROW LEVEL SECURITY;
CREATE POLICY org_scope ON orca.maintenance USING (org_id = (SELECT orca.current_org_id()));
SELECT pg_catalog.pg_extension_config_dump('orca.maintenance', '');
CREATE INDEX maintenance_due ON orca.maintenance (next_fire_at);

-- An interval option, as seconds, at least p_min seconds.
CREATE FUNCTION orca._maintenance_seconds(p_path text, p_value jsonb, p_default text,
                                          p_min_seconds bigint) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_seconds numeric;
BEGIN
    IF p_value IS NULL THEN
        RETURN extract(epoch FROM p_default::interval)::bigint;
    END IF;
    IF jsonb_typeof(p_value) <> 'string' THEN
        RAISE EXCEPTION 'malformed maintenance options: % must be an interval such as ''7 days'', got %',
            p_path, p_value USING ERRCODE = 'OR042';
    END IF;
    BEGIN
        v_seconds := extract(epoch FROM (p_value #>> '{}')::interval);
    EXCEPTION WHEN OTHERS THEN
        RAISE EXCEPTION 'malformed maintenance options: % must be an interval such as ''7 days'', got %',
            p_path, p_value USING ERRCODE = 'OR042';
    END;
    IF v_seconds < p_min_seconds THEN
        RAISE EXCEPTION 'malformed maintenance options: % must be at least % seconds, got % (%)',
            p_path, p_min_seconds, round(v_seconds), p_value #>> '{}'
            USING ERRCODE = 'OR042',
                  HINT = CASE WHEN p_path = 'orphans.older_than' THEN
                      'a file younger than that may belong to a commit in flight' END;
    END IF;
    RETURN v_seconds::bigint;
END
$$;

-- An integer option from p_min.
CREATE FUNCTION orca._maintenance_int(p_path text, p_value jsonb, p_default bigint, p_min bigint)
RETURNS bigint
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_value IS NULL THEN
        RETURN p_default;
    END IF;
    IF jsonb_typeof(p_value) <> 'number' OR (p_value #>> '{}')::numeric <> trunc((p_value #>> '{}')::numeric)
       OR (p_value #>> '{}')::numeric < p_min OR (p_value #>> '{}')::numeric > 1000000000000 THEN
        RAISE EXCEPTION 'malformed maintenance options: % must be an integer from %, got %',
            p_path, p_min, p_value USING ERRCODE = 'OR042';
    END IF;
    RETURN (p_value #>> '{}')::bigint;
END
$$;

-- Options as a run takes them, every default filled in: each operation an
-- object of its settings, or false to skip it. Unknown keys are refused.
CREATE FUNCTION orca._maintenance_options(p_options jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    o jsonb := coalesce(p_options, '{}');
    v_key text;
    v_op jsonb;
    v_out jsonb := '{}';
    v_allowed jsonb := '{"expire": ["keep_last", "older_than", "grace"],
                          "orphans": ["older_than"],
                          "compact": ["small_mb", "min_files"]}';
BEGIN
    IF jsonb_typeof(o) <> 'object' THEN
        RAISE EXCEPTION 'malformed maintenance options: expected a JSON object, got %', o
            USING ERRCODE = 'OR042',
                  HINT = '{"expire": {"keep_last": 10, "older_than": "7 days"}, "orphans": {"older_than": "3 days"}, "compact": false}';
    END IF;
    FOR v_key IN SELECT jsonb_object_keys(o) LOOP
        IF NOT v_allowed ? v_key THEN
            RAISE EXCEPTION 'malformed maintenance options: unknown operation %', quote_literal(v_key)
                USING ERRCODE = 'OR042', HINT = 'the operations are expire, orphans and compact';
        END IF;
    END LOOP;
    FOR v_key IN SELECT jsonb_object_keys(v_allowed) LOOP
        v_op := coalesce(o -> v_key, '{}');
        IF v_op = 'false'::jsonb THEN
            v_out := v_out || jsonb_build_object(v_key, false);
            CONTINUE;
        END IF;
        IF v_op = 'true'::jsonb THEN
            v_op := '{}';
        END IF;
        IF jsonb_typeof(v_op) <> 'object' THEN
            RAISE EXCEPTION 'malformed maintenance options: % must be an object of settings, true or false, got %',
                v_key, v_op USING ERRCODE = 'OR042';
        END IF;
        IF EXISTS (SELECT 1 FROM jsonb_object_keys(v_op) k WHERE NOT (v_allowed -> v_key) ? k) THEN
            RAISE EXCEPTION 'malformed maintenance options: unknown setting %.% (% takes %)',
                v_key, (SELECT k FROM jsonb_object_keys(v_op) k WHERE NOT (v_allowed -> v_key) ? k LIMIT 1),
                v_key, (SELECT string_agg(x, ', ') FROM jsonb_array_elements_text(v_allowed -> v_key) x)
                USING ERRCODE = 'OR042';
        END IF;
        v_out := v_out || jsonb_build_object(v_key, CASE v_key
            WHEN 'expire' THEN jsonb_build_object(
                'keep_last', orca._maintenance_int('expire.keep_last', v_op -> 'keep_last', 10, 1),
                'older_than_seconds', orca._maintenance_seconds('expire.older_than', v_op -> 'older_than', '7 days', 0),
                'grace_seconds', orca._maintenance_seconds('expire.grace', v_op -> 'grace', '1 hour', 0))
            WHEN 'orphans' THEN jsonb_build_object(
                'older_than_seconds', orca._maintenance_seconds('orphans.older_than', v_op -> 'older_than', '3 days', 3600))
            ELSE jsonb_build_object(
                'small_bytes', orca._maintenance_int('compact.small_mb', v_op -> 'small_mb', 32, 1) * 1048576,
                'min_files', orca._maintenance_int('compact.min_files', v_op -> 'min_files', 5, 2))
        END);
    END LOOP;
    RETURN v_out;
END
$$;

-- The pipeline a dataset's maintenance runs under: one whose current
-- version writes it (the oldest, when several do), else one that reads it
-- (a table an outside writer fills), else the pipeline behind the sync
-- that writes it (an Iceberg destination's `namespace.stream`).
CREATE FUNCTION orca._dataset_owner(p_org bigint, p_dataset text) RETURNS orca.pipelines
LANGUAGE plpgsql STABLE AS $$
DECLARE
    p orca.pipelines;
BEGIN
    IF p_dataset IS NULL OR NOT (p_dataset ~ '^[a-z_][a-z0-9_]*\.[a-z_][a-z0-9_]*$') THEN
        RAISE EXCEPTION 'malformed dataset %: write namespace.table in lowercase', quote_nullable(p_dataset)
            USING ERRCODE = 'OR042';
    END IF;
    SELECT x.* INTO p FROM orca.pipelines x
    JOIN orca.step_datasets d ON d.version_id = x.current_version AND d.dataset = p_dataset
    WHERE x.org_id = p_org
    ORDER BY d.mode = 'write' DESC, x.id LIMIT 1;
    IF NOT FOUND THEN
        SELECT x.* INTO p FROM orca.syncs s
        JOIN orca.pipelines x ON x.org_id = s.org_id AND x.name = s.name
        WHERE s.org_id = p_org
          AND s.definition -> 'destination' ->> 'type' = 'iceberg'
          AND s.definition -> 'destination' ->> 'namespace' = split_part(p_dataset, '.', 1)
          AND EXISTS (SELECT 1 FROM jsonb_array_elements(s.definition -> 'streams') st
                      WHERE st ->> 'name' = split_part(p_dataset, '.', 2))
        ORDER BY s.id LIMIT 1;
    END IF;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no pipeline or sync of org ''%'' reads or writes dataset %: its maintenance runs under a pipeline or sync that does',
            (SELECT o.name FROM orca.orgs o WHERE o.id = p_org), p_dataset
            USING ERRCODE = 'OR043';
    END IF;
    RETURN p;
END
$$;

-- Queues a maintenance run of a dataset, or returns the one queued or
-- running for it already.
CREATE FUNCTION orca._queue_maintenance(p_org bigint, p_dataset text, p_options jsonb,
                                        p_trigger text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    p     orca.pipelines := orca._dataset_owner(p_org, p_dataset);
    v_run bigint;
BEGIN
    PERFORM 1 FROM orca.pipelines WHERE id = p.id FOR UPDATE;
    SELECT r.id INTO v_run FROM orca.runs r
    WHERE r.pipeline_id = p.id AND r.kind = 'maintain' AND r.status IN ('queued', 'running')
      AND r.request ->> 'dataset' = p_dataset
    ORDER BY r.id LIMIT 1;
    IF FOUND THEN
        RETURN v_run;
    END IF;
    INSERT INTO orca.runs (org_id, pipeline_id, version_id, partitions, trigger, run_retries, kind,
                           request)
    VALUES (p_org, p.id, p.current_version, ARRAY[p_dataset], p_trigger, 1, 'maintain',
            jsonb_build_object('dataset', p_dataset, 'options', p_options))
    RETURNING id INTO v_run;
    PERFORM orca._event(p_org, 'run.queued', p.id, v_run, NULL,
        jsonb_build_object('trigger', p_trigger, 'kind', 'maintain', 'dataset', p_dataset,
                           'by', session_user));
    UPDATE orca.maintenance SET last_run = v_run WHERE org_id = p_org AND dataset = p_dataset;
    -- Not behind the pipeline's max_runs: maintenance moves no data of its
    -- partitions, and a backfill must not starve it.
    PERFORM orca._start_runs(ARRAY[v_run]);
    RETURN v_run;
END
$$;

CREATE FUNCTION orca.maintain(dataset text, options jsonb DEFAULT '{}') RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_bounded boolean := orca._bound('maintain', 'dataset', octet_length(maintain.dataset), 1024)
                         AND orca._bound('maintain', 'options', octet_length(maintain.options::text), 65536);
BEGIN
    RETURN orca._queue_maintenance(orca.current_org_id(), maintain.dataset,
                                   orca._maintenance_options(maintain.options), 'manual');
END
$$;
COMMENT ON FUNCTION orca.maintain(text, jsonb) IS
'Queues a maintenance run of a dataset and returns it (or the one already queued or running for '
'it): a run of kind maintain under the pipeline that writes the dataset (else one that reads '
'it), which a runner''s '
'orca-engine carries out: compact (rewrites each partition''s small files into one, as one '
'replace snapshot), expire (removes old snapshots and the files only they reached) and orphans '
'(deletes files no metadata references). options, each an object of settings or false to skip '
'it: {"expire": {"keep_last": 10, "older_than": "7 days", "grace": "1 hour"}, '
'"orphans": {"older_than": "3 days"} (at least 1 hour), "compact": {"small_mb": 32, '
'"min_files": 5}} (the defaults). Expiry never removes the current snapshot, the newest '
'keep_last, those younger than older_than or current within grace, a snapshot a run not '
'finished (or failed within older_than) pinned, nor an outside snapshot a sensor has not seen. '
'Events: dataset.compacted, dataset.expired, dataset.orphans_removed. Errors: OR042 malformed '
'dataset or options, OR043 no pipeline reads or writes the dataset. '
'Example: SELECT orca.maintain(''lake.raw'', ''{"expire": {"keep_last": 5}}'');';

CREATE FUNCTION orca.schedule_maintenance(dataset text, cron text, options jsonb DEFAULT '{}',
                                          tz text DEFAULT 'UTC') RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('schedule_maintenance', 'dataset', octet_length(schedule_maintenance.dataset), 1024)
                         AND orca._bound('schedule_maintenance', 'cron', octet_length(schedule_maintenance.cron), 1024)
                         AND orca._bound('schedule_maintenance', 'options', octet_length(schedule_maintenance.options::text), 65536)
                         AND orca._bound('schedule_maintenance', 'tz', octet_length(schedule_maintenance.tz), 1024);
    v_org  bigint := orca.current_org_id();
    v_opts jsonb := orca._maintenance_options(schedule_maintenance.options);
    v_next timestamptz;
BEGIN
    PERFORM orca._dataset_owner(v_org, schedule_maintenance.dataset);
    IF schedule_maintenance.cron IS NULL OR schedule_maintenance.tz IS NULL THEN
        RAISE EXCEPTION 'malformed maintenance schedule: cron and tz must not be NULL'
            USING ERRCODE = 'OR042';
    END IF;
    PERFORM orca._unwrap(orca._cron_check(schedule_maintenance.cron, schedule_maintenance.tz));
    v_next := orca._next_fire(schedule_maintenance.cron, schedule_maintenance.tz, now());
    INSERT INTO orca.maintenance (org_id, dataset, options, cron, tz, next_fire_at)
    VALUES (v_org, schedule_maintenance.dataset, v_opts, schedule_maintenance.cron,
            schedule_maintenance.tz, v_next)
    ON CONFLICT (org_id, dataset) DO UPDATE
    SET options = EXCLUDED.options, cron = EXCLUDED.cron, tz = EXCLUDED.tz,
        next_fire_at = EXCLUDED.next_fire_at;
    PERFORM orca._event(v_org, 'maintenance.scheduled', NULL, NULL, NULL,
        jsonb_build_object('dataset', schedule_maintenance.dataset, 'cron', schedule_maintenance.cron,
                           'tz', schedule_maintenance.tz, 'options', v_opts, 'next', v_next));
    RETURN v_next;
END
$$;
COMMENT ON FUNCTION orca.schedule_maintenance(text, text, jsonb, text) IS
'Schedules a dataset''s maintenance on a cron in a time zone (replacing its schedule): each fire '
'queues a maintenance run with these options, as orca.maintain does (none while one is queued or '
'running). Returns the next fire. orca.maintenance lists the schedules. Errors: OR042, OR043, '
'OR030/OR031 bad cron, OR032 unknown time zone. '
'Example: SELECT orca.schedule_maintenance(''lake.raw'', ''0 4 * * *'', ''{"compact": false}'');';

CREATE FUNCTION orca.unschedule_maintenance(dataset text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_bounded boolean := orca._bound('unschedule_maintenance', 'dataset', octet_length(unschedule_maintenance.dataset), 1024);
    v_org bigint := orca.current_org_id();
BEGIN
    DELETE FROM orca.maintenance m
    WHERE m.org_id = v_org AND m.dataset = unschedule_maintenance.dataset;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM orca._event(v_org, 'maintenance.unscheduled', NULL, NULL, NULL,
        jsonb_build_object('dataset', unschedule_maintenance.dataset));
    RETURN true;
END
$$;
COMMENT ON FUNCTION orca.unschedule_maintenance(text) IS
'Removes a dataset''s maintenance schedule; returns whether it had one. Runs already queued go on.';

-- The tick's part: due maintenance schedules queue their runs.
CREATE FUNCTION orca._tick_maintenance(p_orgs bigint[], p_now timestamptz) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    m record;
    n integer := 0;
BEGIN
    FOR m IN
        SELECT * FROM orca.maintenance x
        WHERE x.next_fire_at <= p_now AND x.org_id = ANY (p_orgs)
        ORDER BY x.next_fire_at
        FOR UPDATE SKIP LOCKED
    LOOP
        BEGIN
            PERFORM orca._queue_maintenance(m.org_id, m.dataset, m.options, 'schedule');
            n := n + 1;
        EXCEPTION WHEN SQLSTATE 'OR043' THEN
            -- The pipeline that wrote it no longer does: the schedule waits.
            PERFORM orca._event(m.org_id, 'maintenance.skipped', NULL, NULL, NULL,
                jsonb_build_object('dataset', m.dataset, 'reason', SQLERRM));
        END;
        UPDATE orca.maintenance SET next_fire_at = orca._next_fire(m.cron, m.tz, p_now)
        WHERE org_id = m.org_id AND dataset = m.dataset;
    END LOOP;
    RETURN jsonb_build_object('maintenance_runs', n);
END
$$;

-- The live lease of a maintenance run's attempt, and its run.
CREATE FUNCTION orca._maintenance_run(p_lease uuid) RETURNS orca.runs
LANGUAGE plpgsql AS $$
DECLARE
    v_org bigint := orca._lease_org(p_lease);
    a orca.attempts;
    r orca.runs;
BEGIN
    a := orca._live_attempt(v_org, p_lease);
    SELECT * INTO r FROM orca.runs WHERE id = a.run_id;
    IF r.kind <> 'maintain' THEN
        RAISE EXCEPTION 'lease % is not a maintenance run''s: run % is a % run', p_lease, r.id, r.kind
            USING ERRCODE = 'OR050';
    END IF;
    RETURN r;
END
$$;

CREATE FUNCTION orca.maintenance_task(lease uuid) RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r orca.runs := orca._maintenance_run(maintenance_task.lease);
    v_dataset text := r.request ->> 'dataset';
    v_keep_seconds bigint := coalesce((r.request #>> '{options,expire,older_than_seconds}')::bigint, 0);
BEGIN
    RETURN jsonb_build_object(
        'run', r.id,
        'attempt', (SELECT a.number FROM orca.attempts a
                    WHERE a.id = orca._lease_attempt(maintenance_task.lease)),
        'pipeline', (SELECT p.name FROM orca.pipelines p WHERE p.id = r.pipeline_id),
        'dataset', v_dataset,
        'options', r.request -> 'options',
        -- What runs that may still read the dataset pinned: not finished, or
        -- failed recently enough to be retried.
        'pinned', coalesce((
            SELECT jsonb_agg(DISTINCT x.snapshot_id)
            FROM orca.reads x JOIN orca.runs ru ON ru.id = x.run_id
            WHERE x.org_id = r.org_id AND x.dataset = v_dataset AND x.snapshot_id IS NOT NULL
              AND (ru.status IN ('queued', 'running')
                   OR (ru.status = 'failed'
                       AND ru.finished_at > now() - make_interval(secs => v_keep_seconds)))), '[]'),
        -- Sensors watching it (they read it and do not write it): what they saw.
        'watchers', coalesce((
            SELECT jsonb_agg(jsonb_build_object(
                'pipeline', p.name,
                'since_ms', (extract(epoch FROM sn.registered_at) * 1000)::bigint,
                'seen', coalesce((SELECT jsonb_agg(s.snapshot_id) FROM orca.sensed s
                                  WHERE s.pipeline_id = sn.pipeline_id AND s.dataset = v_dataset),
                                 '[]')) ORDER BY p.name)
            FROM orca.sensors sn
            JOIN orca.pipelines p ON p.id = sn.pipeline_id
            JOIN orca.pipeline_versions v ON v.id = p.current_version
            WHERE sn.org_id = r.org_id AND v.sensor
              AND EXISTS (SELECT 1 FROM orca.step_datasets d WHERE d.version_id = v.id
                            AND d.dataset = v_dataset AND d.mode = 'read')
              AND NOT EXISTS (SELECT 1 FROM orca.step_datasets d WHERE d.version_id = v.id
                                AND d.dataset = v_dataset AND d.mode = 'write')), '[]'));
END
$$;
COMMENT ON FUNCTION orca.maintenance_task(uuid) IS
'What a maintenance run''s attempt does, under its lease: the dataset, the options, the '
'snapshots runs that may still read it pinned (pinned) and the sensors watching it with the '
'snapshots each saw (watchers), which expiry keeps. orca-engine maintain calls it.';

CREATE FUNCTION orca.report_maintenance(lease uuid, report jsonb) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_bounded boolean := orca._bound('report_maintenance', 'report', octet_length(report_maintenance.report::text), 1048576);
    r orca.runs := orca._maintenance_run(report_maintenance.lease);
    v_attempt bigint := orca._lease_attempt(report_maintenance.lease);
    v_dataset text := r.request ->> 'dataset';
    c jsonb := report_maintenance.report -> 'compact';
    e jsonb := report_maintenance.report -> 'expire';
    o jsonb := report_maintenance.report -> 'orphans';
BEGIN
    IF jsonb_typeof(report_maintenance.report) IS DISTINCT FROM 'object' THEN
        RAISE EXCEPTION 'a maintenance report must be a JSON object, got %',
            coalesce(report_maintenance.report::text, 'NULL') USING ERRCODE = 'OR050';
    END IF;
    IF jsonb_typeof(c) = 'object' THEN
        -- What it read and committed, as a step's are, so the dataset's
        -- history shows the compaction and its run.
        IF (c ->> 'read') IS NOT NULL THEN
            INSERT INTO orca.reads (org_id, run_id, step, partition, dataset, snapshot_id, attempt_id)
            VALUES (r.org_id, r.id, 'maintain', v_dataset, v_dataset, (c ->> 'read')::bigint, v_attempt)
            ON CONFLICT DO NOTHING;
        END IF;
        IF (c ->> 'snapshot') IS NOT NULL THEN
            INSERT INTO orca.commits (org_id, run_id, attempt_id, step, partition, dataset,
                                      snapshot_id, commit_no, operation)
            VALUES (r.org_id, r.id, v_attempt, 'maintain', v_dataset, v_dataset,
                    (c ->> 'snapshot')::bigint, 1, 'replace')
            ON CONFLICT (run_id, step, partition, dataset, commit_no) DO NOTHING;
        END IF;
        PERFORM orca._event(r.org_id, 'dataset.compacted', r.pipeline_id, r.id, v_attempt,
            jsonb_build_object('dataset', v_dataset) || c);
    END IF;
    IF jsonb_typeof(e) = 'object' THEN
        PERFORM orca._event(r.org_id, 'dataset.expired', r.pipeline_id, r.id, v_attempt,
            jsonb_build_object('dataset', v_dataset) || e);
    END IF;
    IF jsonb_typeof(o) = 'object' THEN
        PERFORM orca._event(r.org_id, 'dataset.orphans_removed', r.pipeline_id, r.id, v_attempt,
            jsonb_build_object('dataset', v_dataset) || o);
    END IF;
END
$$;
COMMENT ON FUNCTION orca.report_maintenance(uuid, jsonb) IS
'A maintenance attempt reports what it did: {"compact": {read, snapshot, partitions, '
'files_removed, files_added, rows}, "expire": {snapshots, kept, protected, files_deleted, '
'bytes_deleted}, "orphans": {files, bytes, young, listed}} (an operation it skipped is absent). '
'Each becomes an event (dataset.compacted, dataset.expired, dataset.orphans_removed); the '
'compaction''s read and replace commit are recorded as a step''s are (step maintain).';
