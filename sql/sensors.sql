-- Sensors: pipelines that run when a dataset they read gets a new
-- snapshot, from Orca's own commits or from writers outside it.

-- A sensor saw a snapshot: the first time, it starts one run (trigger sensor)
-- over the partitions the snapshot maps to. Returns the run, or NULL when the
-- snapshot was seen before or maps to no partition.
CREATE FUNCTION orca._sensed(p_org bigint, p_pipeline bigint, p_dataset text, p_snapshot bigint,
                             p_source text, p_upstream text[])
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    p orca.pipelines;
    v orca.pipeline_versions;
    v_parts text[];
    v_run bigint;
BEGIN
    INSERT INTO orca.sensed (org_id, pipeline_id, dataset, snapshot_id, source, upstream)
    VALUES (p_org, p_pipeline, p_dataset, p_snapshot, p_source, coalesce(p_upstream, '{}'))
    ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT * INTO p FROM orca.pipelines WHERE id = p_pipeline;
    SELECT * INTO v FROM orca.pipeline_versions WHERE id = p.current_version;
    IF v.partition_kind = 'keyed' THEN
        -- A keyed sensor's runs are for the snapshot's new keys, which only
        -- a read of the snapshot can tell: a keys task reads and queues them.
        v_run := orca._keys_task(p_org, p_pipeline, 'new', 'sensor',
            jsonb_build_object('snapshot', p_snapshot, 'source', p_source));
        UPDATE orca.sensed SET run_id = v_run
        WHERE pipeline_id = p_pipeline AND dataset = p_dataset AND snapshot_id = p_snapshot;
        PERFORM orca._event(p_org, 'sensor.fired', p_pipeline, v_run, NULL,
            jsonb_build_object('dataset', p_dataset, 'snapshot', p_snapshot, 'source', p_source,
                               'keys_task', v_run));
        RETURN v_run;
    END IF;
    v_parts := orca._sensor_partitions(v.partition_kind, v.partition_start, v.tz, v.fills, v.cron,
                                       coalesce(p_upstream, '{}'), now());
    IF cardinality(v_parts) = 0 THEN
        PERFORM orca._event(p_org, 'sensor.skipped', p_pipeline, NULL, NULL,
            jsonb_build_object('dataset', p_dataset, 'snapshot', p_snapshot,
                               'upstream', p_upstream, 'reason', 'no partition of the pipeline'));
        RETURN NULL;
    END IF;
    INSERT INTO orca.runs (org_id, pipeline_id, version_id, partitions, trigger, run_retries)
    VALUES (p_org, p_pipeline, v.id, v_parts, 'sensor', v.run_retries)
    RETURNING id INTO v_run;
    UPDATE orca.sensed SET run_id = v_run
    WHERE pipeline_id = p_pipeline AND dataset = p_dataset AND snapshot_id = p_snapshot;
    PERFORM orca._event(p_org, 'sensor.fired', p_pipeline, v_run, NULL,
        jsonb_build_object('dataset', p_dataset, 'snapshot', p_snapshot, 'source', p_source,
                           'partitions', v_parts));
    PERFORM orca._runs_created(p_org, p_pipeline, ARRAY[v_run]);
    RETURN v_run;
END
$$;

-- Queues the next poll of a sensor: a new pending attempt of its sense run,
-- of the pipeline's current version (the sense run lives across versions).
CREATE FUNCTION orca._queue_sense(p_run bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    r orca.runs;
    a orca.attempts;
BEGIN
    UPDATE orca.runs SET attempts = attempts + 1 WHERE id = p_run RETURNING * INTO r;
    SELECT * INTO a FROM orca._enqueue_attempts(
        ARRAY[r.id], (SELECT current_version FROM orca.pipelines WHERE id = r.pipeline_id));
    PERFORM orca._event(r.org_id, 'sense.queued', r.pipeline_id, r.id, a.id,
                        jsonb_build_object('attempt', r.attempts));
END
$$;

CREATE FUNCTION orca.sense_context(lease uuid) RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_org bigint := orca._lease_org(sense_context.lease);
    a orca.attempts;
    r orca.runs;
    sn orca.sensors;
BEGIN
    a := orca._live_attempt(v_org, sense_context.lease);
    SELECT * INTO r FROM orca.runs WHERE id = a.run_id;
    IF r.kind <> 'sense' THEN
        RAISE EXCEPTION 'lease % is not a sensor''s poll: run % is a pipeline run',
            sense_context.lease, r.id USING ERRCODE = 'OR050';
    END IF;
    SELECT * INTO sn FROM orca.sensors WHERE pipeline_id = r.pipeline_id;
    RETURN jsonb_build_object(
        'pipeline', (SELECT name FROM orca.pipelines WHERE id = r.pipeline_id),
        'since', sn.registered_at,
        'datasets', coalesce((
            SELECT jsonb_agg(DISTINCT d.dataset ORDER BY d.dataset)
            FROM orca.step_datasets d
            JOIN orca.pipelines p ON p.current_version = d.version_id
            WHERE p.id = r.pipeline_id AND d.mode = 'read'
              -- A keyed sensor watches its keys dataset only.
              AND d.dataset = coalesce((SELECT pv.keys_dataset FROM orca.pipeline_versions pv
                                        WHERE pv.id = d.version_id), d.dataset)
              AND NOT EXISTS (SELECT 1 FROM orca.step_datasets w
                              WHERE w.version_id = d.version_id AND w.dataset = d.dataset
                                AND w.mode = 'write')), '[]'));
END
$$;
COMMENT ON FUNCTION orca.sense_context(uuid) IS
'What a sensor''s poll looks at: the datasets the pipeline reads and does not write, and the '
'time it started watching (snapshots older than that are already seen). The SDK''s sense '
'command calls it.';

CREATE FUNCTION orca.report_snapshots(lease uuid, snapshots jsonb) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('report_snapshots', 'snapshots', octet_length(report_snapshots.snapshots::text), 1048576);
    v_org bigint := orca._lease_org(report_snapshots.lease);
    ctx jsonb := orca.sense_context(report_snapshots.lease);
    r orca.runs;
    sn orca.sensors;
    s jsonb;
    v_started integer := 0;
BEGIN
    IF jsonb_typeof(report_snapshots.snapshots) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'snapshots must be a JSON array, got %', coalesce(report_snapshots.snapshots::text, 'NULL')
            USING ERRCODE = 'OR050';
    END IF;
    SELECT x.* INTO r FROM orca.runs x
    JOIN orca.attempts a ON a.run_id = x.id
    WHERE a.id = orca._lease_attempt(report_snapshots.lease);
    SELECT * INTO sn FROM orca.sensors WHERE pipeline_id = r.pipeline_id;
    FOR s IN SELECT value FROM jsonb_array_elements(report_snapshots.snapshots) ORDER BY (value->>'timestamp_ms')::bigint NULLS FIRST LOOP
        CONTINUE WHEN NOT (ctx->'datasets') ? (s->>'dataset');
        -- Orca's own commits are seen from the control plane once their run succeeds.
        CONTINUE WHEN s->>'orca_run' IS NOT NULL;
        CONTINUE WHEN (s->>'snapshot') IS NULL;
        CONTINUE WHEN to_timestamp(((s->>'timestamp_ms')::bigint) / 1000.0) <= sn.registered_at;
        IF orca._sensed(v_org, r.pipeline_id, s->>'dataset', (s->>'snapshot')::bigint, 'outside',
                        CASE WHEN coalesce(s->>'partitions', '') = '' THEN '{}'::text[]
                             ELSE string_to_array(s->>'partitions', ',') END) IS NOT NULL THEN
            v_started := v_started + 1;
        END IF;
    END LOOP;
    RETURN v_started;
END
$$;
COMMENT ON FUNCTION orca.report_snapshots(uuid, jsonb) IS
'A sensor''s poll reports the snapshots its datasets hold: [{dataset, snapshot, timestamp_ms, '
'partitions, orca_run}]. Each snapshot made by a writer outside Orca after the sensor started '
'watching starts exactly one run (trigger sensor), however often it is reported; partitions '
'come from the snapshot''s orca.partitions property (a day maps to its month, a month to its '
'days), or else from the schedule. Returns how many runs it started.';
