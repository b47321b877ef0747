-- Pipelines: registering versions from manifests, their schedules' next
-- fires, pausing.

CREATE FUNCTION orca._pipeline(p_org bigint, p_name text) RETURNS orca.pipelines
LANGUAGE plpgsql STABLE AS $$
DECLARE
    r orca.pipelines;
BEGIN
    SELECT * INTO r FROM orca.pipelines WHERE org_id = p_org AND name = p_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown pipeline ''%'' in org ''%''', p_name,
                        (SELECT name FROM orca.orgs WHERE id = p_org)
            USING ERRCODE = 'OR010',
                  HINT = 'orca.pipelines lists the registered pipelines; orca.register(manifest) adds one';
    END IF;
    RETURN r;
END
$$;

-- The partition a fire fills; a sync's run is named by its fire instant.
CREATE FUNCTION orca._fire_partition_of(p_kind text, p_start text, p_fills text, p_tz text,
                                        p_fire timestamptz) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN p_kind = 'sync'
                THEN to_char(p_fire AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
                ELSE orca._fire_partition(p_kind, p_start, p_fills, p_tz, p_fire) END
$$;

-- Refuses a registration whose declared reads and writes would close a cycle
-- across pipelines (a pipeline that reads what it writes itself is fine).
CREATE FUNCTION orca._refuse_cycle(p_org bigint, p_pipeline bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_path bigint[];
    v_via  text[];
BEGIN
    WITH RECURSIVE cur AS (
        SELECT p.id AS pipeline_id, d.dataset, d.mode
        FROM orca.pipelines p JOIN orca.step_datasets d ON d.version_id = p.current_version
        WHERE p.org_id = p_org
    ), edge AS (
        SELECT DISTINCT w.pipeline_id AS a, r.pipeline_id AS b, w.dataset
        FROM cur w JOIN cur r ON r.dataset = w.dataset AND w.mode = 'write' AND r.mode = 'read'
                            AND r.pipeline_id <> w.pipeline_id
    ), walk (node, path, via, closed) AS (
        SELECT e.b, ARRAY[p_pipeline, e.b], ARRAY[e.dataset], e.b = p_pipeline
        FROM edge e WHERE e.a = p_pipeline
        UNION ALL
        SELECT e.b, w.path || e.b, w.via || e.dataset, e.b = p_pipeline
        FROM walk w JOIN edge e ON e.a = w.node
        WHERE NOT w.closed AND NOT (e.b = ANY (w.path[2:])) AND cardinality(w.path) < 64
    )
    SELECT path, via INTO v_path, v_via FROM walk WHERE closed LIMIT 1;
    IF v_path IS NOT NULL THEN
        RAISE EXCEPTION 'registering pipeline ''%'' would close a cycle across pipelines: %',
            (SELECT name FROM orca.pipelines WHERE id = p_pipeline),
            (SELECT string_agg(format('%s -[%s]->', p.name, v_via[i]), ' ' ORDER BY i)
                    || ' ' || (SELECT name FROM orca.pipelines WHERE id = p_pipeline)
             FROM generate_subscripts(v_via, 1) AS i
             JOIN orca.pipelines p ON p.id = v_path[i])
            USING ERRCODE = 'OR041',
                  HINT = 'a dataset a pipeline writes may not feed, through other pipelines, a dataset it reads';
    END IF;
END
$$;

-- A schedule's next fire after the instant its fires have been made up to;
-- '-infinity' (due at once) while its clock has not started.
CREATE FUNCTION orca._next_fire(p_cron text, p_tz text, p_after timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_after IS NULL THEN '-infinity'::timestamptz
                ELSE (orca._cron_next(p_cron, p_tz, p_after, 1))[1] END
$$;

CREATE FUNCTION orca.register(manifest jsonb) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_bounded boolean := orca._bound('register', 'manifest', octet_length(register.manifest::text), 1048576);
    v_org bigint := orca.current_org_id();
    m     jsonb;
    v_pid bigint;
    v_cur bigint;
    v_vid bigint;
    v_n   integer;
BEGIN
    IF register.manifest IS NULL THEN
        RAISE EXCEPTION 'malformed manifest: manifest: is required' USING ERRCODE = 'OR040';
    END IF;
    m := orca._unwrap(orca._manifest_check(register.manifest));
    IF EXISTS (SELECT 1 FROM orca.pipelines p JOIN orca.pipeline_versions v ON v.id = p.current_version
               WHERE p.org_id = v_org AND p.name = m->>'name' AND v.partition_kind = 'sync') THEN
        RAISE EXCEPTION 'name ''%'' belongs to a sync; a pipeline needs a name of its own', m->>'name'
            USING ERRCODE = 'OR065';
    END IF;
    INSERT INTO orca.pipelines (org_id, name) VALUES (v_org, m->>'name')
    ON CONFLICT (org_id, name) DO NOTHING;
    SELECT id, current_version INTO v_pid, v_cur
    FROM orca.pipelines WHERE org_id = v_org AND name = m->>'name' FOR UPDATE;

    -- The same manifest again is the same version: registering is idempotent.
    SELECT id INTO v_vid FROM orca.pipeline_versions
    WHERE pipeline_id = v_pid AND pipeline_versions.manifest = m
    ORDER BY id DESC LIMIT 1;
    IF v_vid IS NOT NULL AND v_vid = v_cur THEN
        RETURN v_vid;
    END IF;
    IF v_vid IS NULL THEN
        SELECT coalesce(max(version), 0) + 1 INTO v_n
        FROM orca.pipeline_versions WHERE pipeline_id = v_pid;
        INSERT INTO orca.pipeline_versions (
            org_id, pipeline_id, version, registry_hash, manifest, binary_path, pool,
            partition_kind, partition_start, keys_dataset, keys_column, keys_per_run,
            max_runs, run_retries, catchup, fills,
            cron, tz, source, commit, dirty, image, sensor, binary_sha256)
        SELECT v_org, v_pid, v_n, m->>'registry_hash', m, m->>'binary', m->>'pool',
               k.key, CASE WHEN k.key = 'keyed' THEN '' ELSE k.value #>> '{}' END,
               k.value->>'dataset', k.value->>'column', (m->>'keys_per_run')::int,
               (m->>'max_runs')::int, (m->>'run_retries')::int,
               (m->>'catchup')::boolean, coalesce(m->>'fills', 'previous'), m->'schedule'->>'cron',
               coalesce(m->'schedule'->>'tz', 'UTC'), m->>'source', m->>'commit',
               (m->>'dirty')::boolean, m->>'image', coalesce((m->>'sensor')::boolean, false),
               m->>'binary_sha256'
        FROM jsonb_each(m->'partitions') AS k
        RETURNING id INTO v_vid;
        INSERT INTO orca.steps (org_id, version_id, position, name, kind, after, retries, code)
        SELECT v_org, v_vid, (s.ord - 1)::int, s.step->>'name', s.step->>'kind',
               s.step->>'after', (s.step->>'retries')::int, s.step->>'code'
        FROM jsonb_array_elements(m->'steps') WITH ORDINALITY AS s(step, ord);
        INSERT INTO orca.step_datasets (org_id, version_id, step, dataset, mode)
        SELECT DISTINCT v_org, v_vid, s.step->>'name', d.dataset, d.mode
        FROM jsonb_array_elements(m->'steps') AS s(step)
        CROSS JOIN LATERAL (
            SELECT 'read' AS mode, x AS dataset FROM jsonb_array_elements_text(coalesce(s.step->'reads', '[]')) AS x
            UNION ALL
            SELECT 'write', x FROM jsonb_array_elements_text(coalesce(s.step->'writes', '[]')) AS x
        ) AS d;
        -- The keys dataset is read for the whole pipeline ('*'): sensors
        -- watch it and cycles run through it.
        INSERT INTO orca.step_datasets (org_id, version_id, step, dataset, mode)
        SELECT v_org, v_vid, '*', m->'partitions'->'keyed'->>'dataset', 'read'
        WHERE m->'partitions' ? 'keyed'
        ON CONFLICT DO NOTHING;
    END IF;
    -- Keys read for another dataset or column are not this version's keys.
    IF v_cur IS NOT NULL AND (SELECT (pv.keys_dataset, pv.keys_column) IS DISTINCT FROM
                                     (m->'partitions'->'keyed'->>'dataset',
                                      m->'partitions'->'keyed'->>'column')
                              FROM orca.pipeline_versions pv WHERE pv.id = v_cur) THEN
        DELETE FROM orca.keys WHERE pipeline_id = v_pid;
        UPDATE orca.pipelines
        SET keys_generation = 0, keys_snapshot = NULL, keys_snapshot_ms = NULL, keys_read_at = NULL
        WHERE id = v_pid;
    END IF;
    UPDATE orca.pipelines SET current_version = v_vid, max_runs = (m->>'max_runs')::int
    WHERE id = v_pid;
    PERFORM orca._refuse_cycle(v_org, v_pid);

    IF coalesce((m->>'sensor')::boolean, false) THEN
        -- What the datasets hold now counts as seen: a sensor does not
        -- rebuild history (a backfill does).
        INSERT INTO orca.sensors (org_id, pipeline_id, commit_cursor)
        VALUES (v_org, v_pid, (SELECT coalesce(max(id), 0) FROM orca.commits WHERE org_id = v_org))
        ON CONFLICT (pipeline_id) DO NOTHING;
    ELSE
        DELETE FROM orca.sensors WHERE pipeline_id = v_pid;
    END IF;

    IF jsonb_typeof(m->'schedule') = 'object' THEN
        INSERT INTO orca.schedules (org_id, pipeline_id, cron, tz, fills, catchup)
        VALUES (v_org, v_pid, m->'schedule'->>'cron', m->'schedule'->>'tz', m->>'fills',
                (m->>'catchup')::boolean)
        ON CONFLICT (pipeline_id) DO UPDATE
        SET cron = excluded.cron, tz = excluded.tz, fills = excluded.fills,
            catchup = excluded.catchup,
            next_fire_at = orca._next_fire(excluded.cron, excluded.tz, schedules.fired_until);
    ELSE
        DELETE FROM orca.schedules WHERE pipeline_id = v_pid;
    END IF;

    PERFORM orca._event(v_org, 'pipeline.registered', v_pid, NULL, NULL,
        jsonb_strip_nulls(jsonb_build_object(
            'version_id', v_vid,
            'version', (SELECT version FROM orca.pipeline_versions WHERE id = v_vid),
            'registry_hash', m->>'registry_hash', 'commit', m->>'commit',
            'by', session_user)));
    -- A keyed pipeline reads its keys as soon as it is registered: names
    -- given to orca.run are checked against them, and a sensor's new keys are
    -- new against them.
    IF m->'partitions' ? 'keyed'
       AND (SELECT keys_generation FROM orca.pipelines WHERE id = v_pid) = 0 THEN
        PERFORM orca._keys_task(v_org, v_pid, 'refresh', 'manual');
    END IF;
    -- A larger max_runs may let queued runs start.
    PERFORM orca._start_queued(v_org, v_pid);
    RETURN v_vid;
END
$$;
COMMENT ON FUNCTION orca.register(jsonb) IS
'Registers a pipeline version from the manifest its binary prints with `describe --json` '
'(docs/manifest.md) and makes it current. Returns the version id; the same manifest again '
'returns the same id. Errors: OR040 malformed manifest, OR020 bad partition start, '
'OR030/OR031 unparsable or impossible cron, OR032 unknown time zone, OR041 its declared '
'reads and writes would close a cycle across pipelines.';

CREATE FUNCTION orca.fires(pipeline text, n integer DEFAULT 10, after timestamptz DEFAULT now())
RETURNS TABLE (fire_at timestamptz, partition text)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_bounded boolean := orca._bound('fires', 'pipeline', octet_length(fires.pipeline), 1024);
    v_org bigint := orca.current_org_id();
    p orca.pipelines;
    v orca.pipeline_versions;
    s orca.schedules;
BEGIN
    IF fires.n IS NULL OR fires.n < 0 OR fires.n > 10000 THEN
        RAISE EXCEPTION 'n must be from 0 to 10000, got %', coalesce(fires.n::text, 'NULL')
            USING ERRCODE = 'OR050';
    END IF;
    IF fires.after IS NULL OR NOT isfinite(fires.after) THEN
        RAISE EXCEPTION 'after must be a finite timestamp, got %', coalesce(fires.after::text, 'NULL')
            USING ERRCODE = 'OR050';
    END IF;
    p := orca._pipeline(v_org, fires.pipeline);
    SELECT * INTO s FROM orca.schedules sc WHERE sc.pipeline_id = p.id;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT * INTO v FROM orca.pipeline_versions pv WHERE pv.id = p.current_version;
    RETURN QUERY
    SELECT f, orca._fire_partition_of(v.partition_kind, v.partition_start, s.fills, s.tz, f)
    FROM unnest(orca._cron_next(s.cron, s.tz, fires.after, fires.n)) AS f;
END
$$;
COMMENT ON FUNCTION orca.fires(text, integer, timestamptz) IS
'The next n fires of a pipeline''s schedule after a time, each with the partition it fills '
'(NULL when that partition precedes the pipeline''s first). No rows for a pipeline without '
'a schedule. Example: SELECT * FROM orca.fires(''lake'', 3);';

CREATE FUNCTION orca.pause(pipeline text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_bounded boolean := orca._bound('pause', 'pipeline', octet_length(pause.pipeline), 1024);
    v_org bigint := orca.current_org_id();
    p orca.pipelines;
BEGIN
    p := orca._pipeline(v_org, pause.pipeline);
    UPDATE orca.pipelines SET paused = true WHERE id = p.id;
    PERFORM orca._event(v_org, 'pipeline.paused', p.id, NULL, NULL,
                        jsonb_build_object('by', session_user));
END
$$;
COMMENT ON FUNCTION orca.pause(text) IS
'Pauses a pipeline: its schedule makes no runs and queued runs wait. Running runs go on.';

CREATE FUNCTION orca.unpause(pipeline text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_bounded boolean := orca._bound('unpause', 'pipeline', octet_length(unpause.pipeline), 1024);
    v_org bigint := orca.current_org_id();
    p orca.pipelines;
BEGIN
    p := orca._pipeline(v_org, unpause.pipeline);
    UPDATE orca.pipelines SET paused = false WHERE id = p.id;
    PERFORM orca._event(v_org, 'pipeline.unpaused', p.id, NULL, NULL,
                        jsonb_build_object('by', session_user));
    PERFORM orca._start_queued(v_org, p.id);
END
$$;
COMMENT ON FUNCTION orca.unpause(text) IS
'Unpauses a pipeline; queued runs start within max_runs. Fires that fell while it was paused '
'are not made up.';
