-- The SQL API. Every function runs as the extension owner (SECURITY DEFINER,
-- with a fixed search_path) and scopes every statement to the session's org,
-- because the owner is not subject to row-level security. docs/sql.md is the
-- reference; the COMMENT ON text is what \df+ shows.

---------------------------------------------------------------------------
-- Orgs and members
---------------------------------------------------------------------------

CREATE FUNCTION orca.create_org(name text) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_id bigint;
BEGIN
    IF create_org.name IS NULL OR create_org.name !~ '^[a-z][a-z0-9_-]{0,62}$' THEN
        RAISE EXCEPTION 'invalid org name %', quote_nullable(create_org.name)
            USING ERRCODE = 'OR003',
                  HINT = 'use 1 to 63 lowercase letters, digits, ''_'' or ''-'', starting with a letter';
    END IF;
    INSERT INTO orca.orgs (name) VALUES (create_org.name)
    ON CONFLICT ON CONSTRAINT orgs_name_key DO NOTHING
    RETURNING id INTO v_id;
    IF v_id IS NULL THEN
        RAISE EXCEPTION 'org ''%'' already exists', create_org.name USING ERRCODE = 'OR003';
    END IF;
    PERFORM orca._event(v_id, 'org.created', NULL, NULL, NULL,
                        jsonb_build_object('name', create_org.name, 'by', session_user));
    RETURN v_id;
END
$$;
COMMENT ON FUNCTION orca.create_org(text) IS
'Creates an org and returns its id. Admins only. Example: SELECT orca.create_org(''acme'');';

CREATE FUNCTION orca.add_member(org text, role text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_org bigint;
BEGIN
    SELECT id INTO v_org FROM orca.orgs o WHERE o.name = add_member.org;
    IF v_org IS NULL THEN
        RAISE EXCEPTION 'unknown org ''%''', add_member.org USING ERRCODE = 'OR001';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = add_member.role) THEN
        RAISE EXCEPTION 'unknown role %', quote_nullable(add_member.role)
            USING ERRCODE = 'OR004', HINT = 'create the role first (CREATE ROLE ...)';
    END IF;
    INSERT INTO orca.members (org_id, role_name) VALUES (v_org, add_member.role)
    ON CONFLICT DO NOTHING;
    PERFORM orca._event(v_org, 'org.member_added', NULL, NULL, NULL,
                        jsonb_build_object('role', add_member.role, 'by', session_user));
END
$$;
COMMENT ON FUNCTION orca.add_member(text, text) IS
'Lets a role (and every role that is a member of it) act in an org. Admins only. '
'Permissions come from the orca_viewer, orca_operator, orca_runner and orca_admin roles; '
'membership decides the org. Example: SELECT orca.add_member(''acme'', ''acme_ops'');';

CREATE FUNCTION orca.remove_member(org text, role text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_org bigint;
BEGIN
    SELECT id INTO v_org FROM orca.orgs o WHERE o.name = remove_member.org;
    IF v_org IS NULL THEN
        RAISE EXCEPTION 'unknown org ''%''', remove_member.org USING ERRCODE = 'OR001';
    END IF;
    DELETE FROM orca.members m WHERE m.org_id = v_org AND m.role_name = remove_member.role;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'role % is not a member of org ''%''', quote_nullable(remove_member.role),
                        remove_member.org
            USING ERRCODE = 'OR004';
    END IF;
    PERFORM orca._event(v_org, 'org.member_removed', NULL, NULL, NULL,
                        jsonb_build_object('role', remove_member.role, 'by', session_user));
END
$$;
COMMENT ON FUNCTION orca.remove_member(text, text) IS
'Takes a role''s membership of an org away. Admins only.';

---------------------------------------------------------------------------
-- Pipelines
---------------------------------------------------------------------------

CREATE FUNCTION orca.register(manifest jsonb) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
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
            cron, tz, source, commit, dirty, image, sensor)
        SELECT v_org, v_pid, v_n, m->>'registry_hash', m, m->>'binary', m->>'pool',
               k.key, CASE WHEN k.key = 'keyed' THEN '' ELSE k.value #>> '{}' END,
               k.value->>'dataset', k.value->>'column', (m->>'keys_per_run')::int,
               (m->>'max_runs')::int, (m->>'run_retries')::int,
               (m->>'catchup')::boolean, coalesce(m->>'fills', 'previous'), m->'schedule'->>'cron',
               coalesce(m->'schedule'->>'tz', 'UTC'), m->>'source', m->>'commit',
               (m->>'dirty')::boolean, m->>'image', coalesce((m->>'sensor')::boolean, false)
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
            catchup = excluded.catchup;
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

---------------------------------------------------------------------------
-- Runs
---------------------------------------------------------------------------

CREATE FUNCTION orca.run(pipeline text, partitions text) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_org bigint := orca.current_org_id();
    p orca.pipelines;
    v_parts text[];
    v_id bigint;
BEGIN
    p := orca._pipeline(v_org, run.pipeline);
    IF (SELECT partition_kind FROM orca.pipeline_versions WHERE id = p.current_version) = 'sync' THEN
        IF run.partitions IS DISTINCT FROM 'now' THEN
            RAISE EXCEPTION '''%'' is a sync: it runs from its checkpoint, so the only partition is ''now'', got %',
                            p.name, quote_nullable(run.partitions)
                USING ERRCODE = 'OR021',
                      HINT = format('SELECT orca.run(%L, ''now'')', p.name);
        END IF;
        INSERT INTO orca.runs (org_id, pipeline_id, version_id, partitions, trigger, run_retries, kind)
        SELECT v_org, p.id, v.id, ARRAY[orca._fire_partition_of('sync', '', '', 'UTC', now())],
               'manual', v.run_retries, 'sync'
        FROM orca.pipeline_versions v WHERE v.id = p.current_version
        RETURNING id INTO v_id;
        PERFORM orca._runs_created(v_org, p.id, ARRAY[v_id]);
        RETURN v_id;
    END IF;
    IF (SELECT partition_kind FROM orca.pipeline_versions WHERE id = p.current_version) = 'keyed' THEN
        v_parts := orca._key_names(p, run.partitions);
        IF v_parts IS NULL THEN
            PERFORM orca._check_keys(p, '{}');
            v_parts := ARRAY(SELECT key FROM orca.keys
                             WHERE pipeline_id = p.id AND generation = p.keys_generation
                             ORDER BY key);
            IF cardinality(v_parts) = 0 THEN
                RAISE EXCEPTION 'pipeline ''%'' has no keys: its dataset''s snapshot % holds none',
                                p.name, coalesce(p.keys_snapshot::text, '(none)')
                    USING ERRCODE = 'OR024';
            END IF;
            IF cardinality(v_parts) > orca._max_partitions() THEN
                RAISE EXCEPTION '''@all'' names % partitions, more than the limit of %',
                                cardinality(v_parts), orca._max_partitions()
                    USING ERRCODE = 'OR023',
                          HINT = 'orca.backfill runs every key in runs of keys_per_run';
            END IF;
        END IF;
    ELSE
        v_parts := orca._partitions(p, run.partitions);
    END IF;
    INSERT INTO orca.runs (org_id, pipeline_id, version_id, partitions, trigger, run_retries)
    SELECT v_org, p.id, v.id, v_parts, 'manual', v.run_retries
    FROM orca.pipeline_versions v WHERE v.id = p.current_version
    RETURNING id INTO v_id;
    PERFORM orca._runs_created(v_org, p.id, ARRAY[v_id]);
    RETURN v_id;
END
$$;
COMMENT ON FUNCTION orca.run(text, text) IS
'Queues one run over the given partitions (a gather step sees all of them) and returns its id. '
'partitions: ''2024-01'', ''2024-01,2024-03'', ''2024-01..2024-06'' or ''@all''; for a keyed '
'pipeline, keys ''log-1,log-2'' or ''@all'' (every current key). '
'A sync (orca.create_sync) takes ''now'': one run that reads from its checkpoint. '
'Errors: OR010 unknown pipeline, OR020 malformed partition, OR021 malformed list or range, '
'OR022 partition outside the pipeline''s set, OR023 too many partitions, OR024 not a key.';

CREATE FUNCTION orca.backfill(pipeline text, partitions text) RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_org bigint := orca.current_org_id();
    p orca.pipelines;
    v_parts text[];
    v_ids bigint[];
    v_active text[];
    v_sync_run bigint;
BEGIN
    p := orca._pipeline(v_org, backfill.pipeline);
    IF (SELECT partition_kind FROM orca.pipeline_versions WHERE id = p.current_version) = 'sync' THEN
        IF backfill.partitions IS DISTINCT FROM '@all' THEN
            RAISE EXCEPTION '''%'' is a sync: it backfills ''@all'' (every stream read again from its start), got %',
                            p.name, quote_nullable(backfill.partitions)
                USING ERRCODE = 'OR021',
                      HINT = format('SELECT orca.run(%L, ''now'') queues a run from the checkpoint', p.name);
        END IF;
        INSERT INTO orca.runs (org_id, pipeline_id, version_id, partitions, trigger, run_retries,
                               kind, request)
        SELECT v_org, p.id, v.id, ARRAY[orca._fire_partition_of('sync', '', '', 'UTC', now())],
               'backfill', v.run_retries, 'sync', '{"mode": "full"}'
        FROM orca.pipeline_versions v WHERE v.id = p.current_version
        RETURNING id INTO v_sync_run;
        PERFORM orca._runs_created(v_org, p.id, ARRAY[v_sync_run]);
        RETURN NEXT v_sync_run;
        RETURN;
    END IF;
    IF (SELECT partition_kind FROM orca.pipeline_versions WHERE id = p.current_version) = 'keyed' THEN
        v_parts := orca._key_names(p, backfill.partitions);
        IF v_parts IS NULL THEN
            -- Every key that is not done: which keys there are is for a read
            -- of the dataset to say, so a keys task queues the runs.
            RETURN NEXT orca._keys_task(v_org, p.id, 'all', 'backfill');
            RETURN;
        END IF;
        RETURN QUERY SELECT unnest(orca._queue_key_runs(v_org, p.id, v_parts, 'backfill', NULL));
        RETURN;
    END IF;
    v_parts := orca._partitions(p, backfill.partitions);
    -- A partition that already has a queued or running run is not queued twice.
    SELECT array_agg(DISTINCT x) INTO v_active
    FROM orca.runs r, unnest(r.partitions) AS x
    WHERE r.pipeline_id = p.id AND r.status IN ('queued', 'running') AND x = ANY (v_parts);
    WITH ins AS (
        INSERT INTO orca.runs (org_id, pipeline_id, version_id, partitions, trigger, run_retries)
        SELECT v_org, p.id, v.id, ARRAY[x.part], 'backfill', v.run_retries
        FROM unnest(v_parts) WITH ORDINALITY AS x(part, ord)
        CROSS JOIN orca.pipeline_versions v
        WHERE v.id = p.current_version
          AND NOT (x.part = ANY (coalesce(v_active, '{}')))
        ORDER BY x.ord
        RETURNING id
    )
    SELECT array_agg(id ORDER BY id) INTO v_ids FROM ins;
    IF v_active IS NOT NULL THEN
        RAISE NOTICE 'skipped % partition(s) that already have a queued or running run: %',
            cardinality(v_active), array_to_string(v_active[1:10], ', ')
            || CASE WHEN cardinality(v_active) > 10 THEN ', ...' ELSE '' END;
    END IF;
    PERFORM orca._runs_created(v_org, p.id, v_ids);
    RETURN QUERY SELECT unnest(coalesce(v_ids, '{}'));
END
$$;
COMMENT ON FUNCTION orca.backfill(text, text) IS
'Queues one run per partition, oldest first, and returns their ids. Partitions that already '
'have a queued or running run are skipped (with a NOTICE). partitions: ''2024-01..2024-06'' '
'(inclusive), ''2024-01,2024-03'' or ''@all'' (from the pipeline''s start to the current '
'partition). Example: SELECT orca.backfill(''lake'', ''2024-01..2024-06''); '
'A keyed pipeline takes keys (''log-1,log-2''), queued in runs of keys_per_run, or ''@all'', '
'which returns the id of a keys task (a run of kind keys): it reads the keys dataset and '
'queues runs of keys_per_run for every key that is not done (runs.parent_run names it). '
'A sync (orca.create_sync) takes ''@all'': one run that reads every stream again from its '
'start (a merge converges, an append with _orca_id skipping adds only what it lacks).';

CREATE FUNCTION orca.cancel(run bigint) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_org bigint := orca.current_org_id();
    r orca.runs;
BEGIN
    SELECT * INTO r FROM orca.runs WHERE id = cancel.run AND org_id = v_org FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown run %', coalesce(cancel.run::text, 'NULL') USING ERRCODE = 'OR011';
    END IF;
    IF r.status NOT IN ('queued', 'running') THEN
        RAISE EXCEPTION 'run % is already %', r.id, r.status
            USING ERRCODE = 'OR013', HINT = 'only queued or running runs can be cancelled';
    END IF;
    UPDATE orca.runs SET status = 'cancelled', finished_at = now() WHERE id = r.id;
    -- Queue rows before attempts, the order orca.claim takes them in: the
    -- other order deadlocked with a claim that had picked this run's attempt
    -- and not yet leased it. Such a claim finishes first; its attempt is then
    -- leased, and cancelled below like any leased one.
    DELETE FROM orca.queue q
    WHERE q.org_id = v_org
      AND q.attempt_id IN (SELECT a.id FROM orca.attempts a WHERE a.run_id = r.id);
    WITH c AS (
        UPDATE orca.attempts a SET status = 'cancelled', finished_at = now(), error = 'run cancelled'
        WHERE a.run_id = r.id AND a.status IN ('pending', 'leased')
        RETURNING a.id, a.number, a.runner, a.pool
    ), dl AS (
        DELETE FROM orca.leases l USING c WHERE l.attempt_id = c.id
    )
    INSERT INTO orca.events (org_id, kind, pipeline_id, run_id, attempt_id, data)
    SELECT v_org, 'attempt.cancelled', r.pipeline_id, r.id, c.id,
           jsonb_strip_nulls(jsonb_build_object('attempt', c.number, 'runner', c.runner))
    FROM c;
    UPDATE orca.step_states SET status = 'cancelled', updated_at = now()
    WHERE run_id = r.id AND status IN ('pending', 'running');
    PERFORM orca._event(v_org, 'run.cancelled', r.pipeline_id, r.id, NULL,
                        jsonb_build_object('was', r.status, 'by', session_user));
    PERFORM orca._slot_freed(v_org, r.pipeline_id);
END
$$;
COMMENT ON FUNCTION orca.cancel(bigint) IS
'Cancels a queued or running run. A runner holding one of its leases gets OR015 on its next '
'heartbeat and stops the attempt. Errors: OR011 unknown run, OR013 run already finished.';

CREATE FUNCTION orca.retry(run bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_org bigint := orca.current_org_id();
    r orca.runs;
    v orca.pipeline_versions;
BEGIN
    SELECT * INTO r FROM orca.runs WHERE id = retry.run AND org_id = v_org FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown run %', coalesce(retry.run::text, 'NULL') USING ERRCODE = 'OR011';
    END IF;
    IF r.status NOT IN ('failed', 'cancelled') THEN
        RAISE EXCEPTION 'run % is %', r.id, r.status
            USING ERRCODE = 'OR013',
                  HINT = 'only failed or cancelled runs can be retried; orca.run starts a new one';
    END IF;
    SELECT pv.* INTO v FROM orca.pipeline_versions pv
    JOIN orca.pipelines p ON p.current_version = pv.id WHERE p.id = r.pipeline_id;
    -- The retry runs the pipeline's current code; steps that succeeded under
    -- the same code are skipped by the pipeline binary.
    UPDATE orca.runs
    SET status = 'queued', version_id = v.id, run_retries = v.run_retries, failures = 0,
        losses = 0, error = NULL, finished_at = NULL
    WHERE id = r.id;
    UPDATE orca.step_states SET status = 'pending', error = NULL, updated_at = now()
    WHERE run_id = r.id AND status <> 'succeeded';
    PERFORM orca._event(v_org, 'run.retried', r.pipeline_id, r.id, NULL,
                        jsonb_build_object('was', r.status, 'version_id', v.id, 'by', session_user));
    IF r.kind = 'keys' THEN
        -- A keys task has no steps: it reads keys again and takes no run slot.
        PERFORM orca._start_runs(ARRAY[r.id]);
    ELSE
        PERFORM orca._runs_created(v_org, r.pipeline_id, ARRAY[r.id]);
    END IF;
    RETURN r.id;
END
$$;
COMMENT ON FUNCTION orca.retry(bigint) IS
'Queues a failed or cancelled run again, with the pipeline''s current version and a fresh '
'run_retries budget; returns the run id. Errors: OR011 unknown run, OR013 run not failed or cancelled.';

---------------------------------------------------------------------------
-- Dispatch: runners claim attempts, heartbeat their leases and finish them
---------------------------------------------------------------------------

CREATE FUNCTION orca.register_runner(name text, pool text DEFAULT 'default',
                                     slots integer DEFAULT NULL, host text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_org bigint := orca.current_org_id();
BEGIN
    IF register_runner.name IS NULL OR length(register_runner.name) NOT BETWEEN 1 AND 128 THEN
        RAISE EXCEPTION 'runner name must be 1 to 128 characters, got %',
            quote_nullable(register_runner.name) USING ERRCODE = 'OR050';
    END IF;
    INSERT INTO orca.runners (org_id, name, pool, slots, host)
    VALUES (v_org, register_runner.name, coalesce(register_runner.pool, 'default'),
            register_runner.slots, register_runner.host)
    ON CONFLICT (org_id, name) DO UPDATE
    SET pool = excluded.pool, slots = excluded.slots, host = excluded.host, last_seen = now();
    PERFORM orca._event(v_org, 'runner.registered', NULL, NULL, NULL,
        jsonb_strip_nulls(jsonb_build_object('runner', register_runner.name,
                                             'pool', register_runner.pool,
                                             'slots', register_runner.slots,
                                             'host', register_runner.host)));
END
$$;
COMMENT ON FUNCTION orca.register_runner(text, text, integer, text) IS
'Records a runner (name, pool, slots, host) in orca.runners. orca.claim also records the '
'runners it sees, so calling this is optional.';

CREATE FUNCTION orca.claim(runner text, pool text DEFAULT 'default', max integer DEFAULT 1)
RETURNS SETOF orca.lease
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_org bigint := orca.current_org_id();
    v_org_name text := (SELECT o.name FROM orca.orgs o WHERE o.id = v_org);
    v_ttl interval := make_interval(secs => orca._lease_seconds());
    v_ids  bigint[];
    v_tids tid[];
BEGIN
    IF claim.runner IS NULL OR length(claim.runner) NOT BETWEEN 1 AND 128 THEN
        RAISE EXCEPTION 'runner name must be 1 to 128 characters, got %', quote_nullable(claim.runner)
            USING ERRCODE = 'OR050';
    END IF;
    IF claim.pool IS NULL OR claim.pool = '' THEN
        RAISE EXCEPTION 'pool must be a non-empty name, got %', quote_nullable(claim.pool)
            USING ERRCODE = 'OR050';
    END IF;
    IF claim.max IS NULL OR claim.max NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'max must be from 1 to 1000, got %', coalesce(claim.max::text, 'NULL')
            USING ERRCODE = 'OR050';
    END IF;
    -- Keep the runner's row fresh without writing it on every poll. The
    -- read comes first because an upsert locks the row even when its WHERE
    -- then declines to update, and that lock would last the whole claim.
    IF NOT EXISTS (SELECT 1 FROM orca.runners rn
                   WHERE rn.org_id = v_org AND rn.name = claim.runner AND rn.pool = claim.pool
                     AND rn.last_seen >= now() - interval '1 second') THEN
        INSERT INTO orca.runners AS rn (org_id, name, pool)
        VALUES (v_org, claim.runner, claim.pool)
        ON CONFLICT (org_id, name) DO UPDATE SET last_seen = now(), pool = excluded.pool
        WHERE rn.last_seen < now() - interval '1 second' OR rn.pool <> excluded.pool;
    END IF;

    -- The pick is a statement of its own, and every table below is reached
    -- through = ANY (v_ids): each statement then has one plan that stays on
    -- primary keys, which PL/pgSQL caches instead of planning the whole
    -- claim again on every call (a third of a small claim's time).
    -- The picked rows stay locked to the end of the transaction, so their
    -- ctids hold and the delete finds them by ctid, not by a filter on the
    -- queue's key.
    SELECT array_agg(x.attempt_id ORDER BY x.attempt_id), array_agg(x.ctid)
    INTO v_ids, v_tids
    FROM (SELECT q.attempt_id, q.ctid FROM orca.queue q
          WHERE q.org_id = v_org AND q.pool = claim.pool
          ORDER BY q.attempt_id
          LIMIT claim.max
          FOR UPDATE SKIP LOCKED) x;
    IF v_ids IS NULL THEN
        RETURN;
    END IF;

    RETURN QUERY
    WITH picked AS (
        DELETE FROM orca.queue q WHERE q.ctid = ANY (v_tids)
    ), leased AS (
        -- leased_at is the clock, not the transaction's start: this statement
        -- may see an attempt that a finish committed after this transaction
        -- began, and must not look leased before the run ahead of it ended.
        UPDATE orca.attempts a
        SET status = 'leased', runner = claim.runner, lease = orca._new_lease(a.id),
            leased_at = clock_timestamp(), heartbeat_at = now(), deadline = now() + v_ttl
        WHERE a.id = ANY (v_ids) AND a.status = 'pending' AND a.org_id = v_org
        RETURNING a.id, a.run_id, a.lease, a.version_id, a.number, a.deadline, a.pool
    ), live AS (
        INSERT INTO orca.leases (org_id, attempt_id, lease, runner, deadline)
        SELECT v_org, l.id, l.lease, claim.runner, l.deadline FROM leased l
    ), info AS (
        -- LATERAL keeps these lookups on primary keys whatever the planner
        -- guesses about how many rows the UPDATE returns.
        SELECT l.*, x.*
        FROM leased l
        CROSS JOIN LATERAL (
            SELECT r.pipeline_id, p.name AS pipeline_name, r.partitions, v.binary_path,
                   v.registry_hash, r.kind AS run_kind
            FROM orca.runs r, orca.pipelines p, orca.pipeline_versions v
            WHERE r.id = l.run_id AND p.id = r.pipeline_id AND v.id = l.version_id
        ) x
    ), ev AS (
        INSERT INTO orca.events (org_id, kind, pipeline_id, run_id, attempt_id, data)
        SELECT v_org, 'attempt.leased', i.pipeline_id, i.run_id, i.id,
               jsonb_build_object('attempt', i.number, 'runner', claim.runner)
        FROM info i
    )
    SELECT i.id, i.run_id, i.lease, i.pipeline_name, i.version_id, i.binary_path, i.partitions,
           i.number, i.deadline, i.registry_hash, i.pool, v_org_name,
           CASE i.run_kind WHEN 'sense' THEN 'sense' WHEN 'keys' THEN 'keys'
                           WHEN 'sync' THEN 'sync' ELSE 'attempt' END
    FROM info i
    ORDER BY i.id;
END
$$;
COMMENT ON FUNCTION orca.claim(text, text, integer) IS
'Leases up to max pending attempts of a pool to a runner, oldest first, with FOR UPDATE SKIP '
'LOCKED so that concurrent runners never get the same attempt. Each lease lasts '
'orca.lease_seconds; keep it with orca.heartbeat and end it with orca.finish. '
'Example: SELECT * FROM orca.claim(''runner-1'', max => 4);';

CREATE FUNCTION orca.heartbeat(lease uuid) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_org bigint := orca.current_org_id();
    v_deadline timestamptz;
BEGIN
    UPDATE orca.leases l
    SET deadline = now() + make_interval(secs => orca._lease_seconds()), heartbeat_at = now()
    WHERE l.attempt_id = orca._lease_attempt(heartbeat.lease) AND l.lease = heartbeat.lease
      AND l.org_id = v_org
    RETURNING l.deadline INTO v_deadline;
    IF v_deadline IS NULL THEN
        PERFORM orca._lease_refused(v_org, heartbeat.lease);
    END IF;
    RETURN v_deadline;
END
$$;
COMMENT ON FUNCTION orca.heartbeat(uuid) IS
'Extends a lease by orca.lease_seconds and returns the new deadline. Errors: OR012 unknown '
'lease, OR014 lease no longer active (lost or finished: stop the attempt), OR015 run cancelled '
'(stop the attempt).';

CREATE FUNCTION orca.finish(lease uuid, ok boolean, error text DEFAULT NULL) RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_org bigint := orca.current_org_id();
    a     orca.attempts;
BEGIN
    IF finish.ok IS NULL THEN
        RAISE EXCEPTION 'ok must be true or false, got NULL' USING ERRCODE = 'OR050';
    END IF;
    a := orca._leased_attempt(v_org, finish.lease);
    RETURN orca._attempt_ended(
        a.id,
        CASE WHEN finish.ok THEN 'succeeded' ELSE 'failed' END,
        CASE WHEN finish.ok THEN NULL
             ELSE coalesce(finish.error, 'the attempt failed without a message') END);
END
$$;
COMMENT ON FUNCTION orca.finish(uuid, boolean, text) IS
'Ends a leased attempt: ok => true marks the run succeeded; ok => false records the error and '
'retries the run while its run_retries last, else fails it. Returns the run''s status '
'afterwards (succeeded, running when retried, failed). A stale or foreign lease gets OR012, '
'OR014 or OR015 and changes nothing.';

CREATE FUNCTION orca.finish_many(leases uuid[], ok boolean DEFAULT true, error text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_org bigint := orca.current_org_id();
    v_ids bigint[];
    v_bad uuid;
    v_id  bigint;
    v_n   integer;
    v_done      uuid[];
    v_pipelines bigint[];
    v_sense     boolean;
BEGIN
    IF finish_many.ok IS NULL THEN
        RAISE EXCEPTION 'ok must be true or false, got NULL' USING ERRCODE = 'OR050';
    END IF;
    IF finish_many.leases IS NULL OR cardinality(finish_many.leases) = 0 THEN
        RETURN 0;
    END IF;
    IF cardinality(finish_many.leases) > 10000 THEN
        RAISE EXCEPTION 'at most 10000 leases at once, got %', cardinality(finish_many.leases)
            USING ERRCODE = 'OR050';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(finish_many.leases) AS x WHERE x IS NULL) THEN
        PERFORM orca._lease_refused(v_org, NULL);
    END IF;
    v_ids := ARRAY(SELECT orca._lease_attempt(x) FROM unnest(finish_many.leases) AS x);
    -- Runs first, in id order: the lock order every API function keeps. The
    -- same statement learns their pipelines and whether any is a sensor's.
    -- LATERAL keeps each run a primary-key lookup: for a batch of a few
    -- hundred the planner otherwise scans the whole runs table, which costs
    -- more than all of the batch's writes once the history is large.
    SELECT array_agg(DISTINCT x.pipeline_id), coalesce(bool_or(x.kind = 'sense'), false)
    INTO v_pipelines, v_sense
    FROM (SELECT DISTINCT a.run_id FROM orca.attempts a
          WHERE a.id = ANY (v_ids) AND a.org_id = v_org
          ORDER BY a.run_id) u
    CROSS JOIN LATERAL (SELECT r.pipeline_id, r.kind FROM orca.runs r
                        WHERE r.id = u.run_id FOR UPDATE) x;

    -- Failures (retries) and a sensor's polls (whose run stays running) take
    -- the one-at-a-time path.
    IF NOT finish_many.ok OR v_sense THEN
        -- All or nothing: one lease that is not live refuses the whole call.
        SELECT x INTO v_bad FROM unnest(finish_many.leases) AS x
        WHERE x IS NULL OR NOT EXISTS (
            SELECT 1 FROM orca.leases l
            WHERE l.attempt_id = orca._lease_attempt(x) AND l.lease = x AND l.org_id = v_org)
        LIMIT 1;
        IF FOUND THEN
            PERFORM orca._lease_refused(v_org, v_bad);
        END IF;
        v_n := 0;
        FOR v_id IN SELECT DISTINCT unnest(v_ids) ORDER BY 1 LOOP
            PERFORM orca._attempt_ended(v_id,
                CASE WHEN finish_many.ok THEN 'succeeded' ELSE 'failed' END,
                CASE WHEN finish_many.ok THEN NULL
                     ELSE coalesce(finish_many.error, 'the attempt failed without a message') END);
            v_n := v_n + 1;
        END LOOP;
        RETURN v_n;
    END IF;

    -- Success, set-based: what _attempt_ended does for one attempt, for all.
    -- The lease check is the delete itself: a token that is not live deletes
    -- nothing, and the error below then undoes the whole call.
    WITH live AS (
        DELETE FROM orca.leases l
        WHERE l.attempt_id = ANY (v_ids) AND l.org_id = v_org AND l.lease = ANY (finish_many.leases)
        RETURNING l.attempt_id, l.deadline, l.heartbeat_at
    ), a AS (
        UPDATE orca.attempts x
        SET status = 'succeeded', finished_at = now(), error = NULL,
            deadline = live.deadline, heartbeat_at = live.heartbeat_at
        FROM live WHERE x.id = live.attempt_id
        RETURNING x.org_id, x.id, x.run_id, x.number, x.runner, x.lease
    ), r AS (
        UPDATE orca.runs y SET status = 'succeeded', finished_at = now(), error = NULL
        FROM a WHERE y.id = a.run_id AND y.status = 'running'
        RETURNING y.org_id, y.id, y.pipeline_id, y.attempts, a.id AS attempt_id,
                  a.number, a.runner
    ), ev AS (
        INSERT INTO orca.events (org_id, kind, pipeline_id, run_id, attempt_id, data)
        SELECT r.org_id, e.kind, r.pipeline_id, r.id, r.attempt_id, e.data
        FROM r
        CROSS JOIN LATERAL (VALUES
            (1, 'attempt.succeeded', jsonb_strip_nulls(jsonb_build_object('attempt', r.number, 'runner', r.runner))),
            (2, 'run.succeeded', jsonb_build_object('attempts', r.attempts))) AS e(ord, kind, data)
        ORDER BY r.attempt_id, e.ord
    )
    SELECT array_agg(a.lease) INTO v_done FROM a;
    v_n := coalesce(cardinality(v_done), 0);
    IF v_n < (SELECT count(DISTINCT x) FROM unnest(finish_many.leases) AS x) THEN
        SELECT x INTO v_bad FROM unnest(finish_many.leases) AS x
        WHERE NOT (x = ANY (coalesce(v_done, '{}')))
        LIMIT 1;
        PERFORM orca._lease_refused(v_org, v_bad);
    END IF;
    FOREACH v_id IN ARRAY coalesce(v_pipelines, '{}') LOOP
        PERFORM orca._slot_freed(v_org, v_id);
    END LOOP;
    RETURN v_n;
END
$$;
COMMENT ON FUNCTION orca.finish_many(uuid[], boolean, text) IS
'orca.finish for many leases in one call (up to 10000), for runners that finish attempts in '
'batches: all succeeded (ok => true) or all failed with the same error. All or nothing: one '
'lease that is not active refuses the call (OR012/OR014/OR015) and nothing changes. Returns '
'how many attempts it finished.';

CREATE FUNCTION orca.release(lease uuid, reason text DEFAULT NULL) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_org bigint := orca.current_org_id();
    a     orca.attempts;
BEGIN
    a := orca._leased_attempt(v_org, release.lease);
    PERFORM orca._attempt_ended(a.id, 'released',
                                coalesce(release.reason, 'released by its runner'));
END
$$;
COMMENT ON FUNCTION orca.release(uuid, text) IS
'Hands a leased attempt back unfinished, for a runner that is shutting down: the run gets a '
'new pending attempt at once, and neither run_retries nor the lost-attempt budget is spent. '
'Errors: OR012/OR014/OR015 for the lease.';

CREATE FUNCTION orca.report_step(lease uuid, step text, partition text, status text,
                                 error text DEFAULT NULL, output jsonb DEFAULT NULL,
                                 code text DEFAULT NULL, input_hash text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_org bigint := orca.current_org_id();
    a orca.attempts;
    v_pipeline bigint;
    v_attempts integer;
BEGIN
    SELECT x.* INTO a FROM orca.leases l JOIN orca.attempts x ON x.id = l.attempt_id
    WHERE l.attempt_id = orca._lease_attempt(report_step.lease) AND l.lease = report_step.lease
      AND l.org_id = v_org;
    IF NOT FOUND THEN
        PERFORM orca._lease_refused(v_org, report_step.lease);
    END IF;
    IF report_step.status IS NULL
       OR report_step.status NOT IN ('running', 'succeeded', 'failed', 'skipped') THEN
        RAISE EXCEPTION 'step status must be running, succeeded, failed or skipped, got %',
            quote_nullable(report_step.status) USING ERRCODE = 'OR050';
    END IF;
    UPDATE orca.step_states s
    SET status = report_step.status,
        attempts = s.attempts + (report_step.status = 'running')::int,
        error = report_step.error,
        output = CASE WHEN report_step.status = 'succeeded' THEN report_step.output
                      ELSE s.output END,
        code = CASE WHEN report_step.status = 'succeeded' THEN report_step.code ELSE s.code END,
        input_hash = CASE WHEN report_step.status = 'succeeded' THEN report_step.input_hash
                          ELSE s.input_hash END,
        updated_at = now()
    WHERE s.run_id = a.run_id AND s.step = report_step.step
      AND s.partition = report_step.partition
    RETURNING s.attempts INTO v_attempts;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run % has no step % for partition %', a.run_id,
            quote_nullable(report_step.step), quote_nullable(report_step.partition)
            USING ERRCODE = 'OR016', HINT = 'a gather step''s partition is ''*''';
    END IF;
    SELECT pipeline_id INTO v_pipeline FROM orca.runs WHERE id = a.run_id;
    PERFORM orca._event(v_org, 'step.' || report_step.status, v_pipeline, a.run_id, a.id,
        jsonb_strip_nulls(jsonb_build_object('step', report_step.step,
                                             'partition', report_step.partition,
                                             'attempt', a.number, 'step_attempt', v_attempts,
                                             'error', report_step.error)));
    RETURN v_attempts;
END
$$;
COMMENT ON FUNCTION orca.report_step(uuid, text, text, text, text, jsonb, text, text) IS
'Records the state of one (step, partition) of the run a lease belongs to: running (counts a '
'step attempt), succeeded (with its output, the step''s code hash and its input''s hash), '
'failed (with its error) or skipped. Returns the pair''s attempt count. Pipeline binaries call '
'it as they go. Errors: OR012/OR014/OR015 for the lease, OR016 unknown step or partition.';

CREATE FUNCTION orca.attempt_context(lease uuid, build jsonb DEFAULT '{}') RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_org bigint := orca.current_org_id();
    a orca.attempts;
    r orca.runs;
    v orca.pipeline_versions;
BEGIN
    SELECT x.* INTO a FROM orca.leases l JOIN orca.attempts x ON x.id = l.attempt_id
    WHERE l.attempt_id = orca._lease_attempt(attempt_context.lease)
      AND l.lease = attempt_context.lease AND l.org_id = v_org;
    IF NOT FOUND THEN
        PERFORM orca._lease_refused(v_org, attempt_context.lease);
    END IF;
    UPDATE orca.attempts SET build = coalesce(attempt_context.build, '{}') WHERE id = a.id;
    SELECT * INTO r FROM orca.runs WHERE id = a.run_id;
    SELECT * INTO v FROM orca.pipeline_versions WHERE id = a.version_id;
    RETURN jsonb_build_object(
        'org', (SELECT name FROM orca.orgs WHERE id = v_org),
        'pipeline', (SELECT name FROM orca.pipelines WHERE id = r.pipeline_id),
        'run', r.id,
        'attempt', a.number,
        'version', v.version,
        'registry_hash', v.registry_hash,
        'partitions', to_jsonb(r.partitions),
        'states', coalesce((
            SELECT jsonb_agg(jsonb_build_object(
                       'step', s.step, 'partition', s.partition, 'status', s.status,
                       'attempts', s.attempts, 'code', s.code, 'input_hash', s.input_hash,
                       'output', s.output) ORDER BY s.step, s.partition)
            FROM orca.step_states s WHERE s.run_id = r.id), '[]'));
END
$$;
COMMENT ON FUNCTION orca.attempt_context(uuid, jsonb) IS
'What a pipeline binary needs to run a leased attempt: the run, its partitions, the version''s '
'registry hash, and every (step, partition) state with the output, code hash and input hash it '
'succeeded with. Records the binary''s build (registry hash, source, commit, dirty, image) on '
'the attempt. Errors: OR012/OR014/OR015 for the lease.';

---------------------------------------------------------------------------
-- Datasets: pinned reads, recorded commits, lineage
---------------------------------------------------------------------------

-- The live attempt a lease holds, with the (step, partition) and the dataset
-- checked against the run and the step's declaration.
CREATE FUNCTION orca._dataset_access(p_org bigint, p_lease uuid, p_step text, p_partition text,
                                     p_dataset text, p_mode text)
RETURNS orca.attempts
LANGUAGE plpgsql AS $$
DECLARE
    a orca.attempts;
BEGIN
    SELECT x.* INTO a FROM orca.leases l JOIN orca.attempts x ON x.id = l.attempt_id
    WHERE l.attempt_id = orca._lease_attempt(p_lease) AND l.lease = p_lease AND l.org_id = p_org;
    IF NOT FOUND THEN
        PERFORM orca._lease_refused(p_org, p_lease);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM orca.step_states s
                   WHERE s.run_id = a.run_id AND s.step = p_step AND s.partition = p_partition) THEN
        RAISE EXCEPTION 'run % has no step % for partition %', a.run_id, quote_nullable(p_step),
            quote_nullable(p_partition) USING ERRCODE = 'OR016';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM orca.step_datasets d
                   WHERE d.version_id = a.version_id AND d.step = p_step
                     AND d.dataset = p_dataset AND d.mode = p_mode) THEN
        RAISE EXCEPTION 'step % does not declare dataset % in its %', p_step,
            quote_nullable(p_dataset), CASE p_mode WHEN 'read' THEN 'reads' ELSE 'writes' END
            USING ERRCODE = 'OR017',
                  HINT = 'declare it in the step: #[orca::step(..., reads = [...], writes = [...])]';
    END IF;
    RETURN a;
END
$$;

CREATE FUNCTION orca.pin_read(lease uuid, step text, partition text, dataset text, snapshot bigint)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_org bigint := orca.current_org_id();
    a orca.attempts;
    v_pinned bigint;
    v_new integer;
BEGIN
    a := orca._dataset_access(v_org, pin_read.lease, pin_read.step, pin_read.partition,
                              pin_read.dataset, 'read');
    INSERT INTO orca.reads (org_id, run_id, step, partition, dataset, snapshot_id, attempt_id)
    VALUES (v_org, a.run_id, pin_read.step, pin_read.partition, pin_read.dataset,
            pin_read.snapshot, a.id)
    ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS v_new = ROW_COUNT;
    SELECT r.snapshot_id INTO v_pinned FROM orca.reads r
    WHERE r.run_id = a.run_id AND r.step = pin_read.step AND r.partition = pin_read.partition
      AND r.dataset = pin_read.dataset;
    IF v_new > 0 THEN
        PERFORM orca._event(v_org, 'dataset.read', (SELECT pipeline_id FROM orca.runs WHERE id = a.run_id),
            a.run_id, a.id,
            jsonb_build_object('dataset', pin_read.dataset, 'snapshot', v_pinned,
                               'step', pin_read.step, 'partition', pin_read.partition));
    END IF;
    RETURN v_pinned;
END
$$;
COMMENT ON FUNCTION orca.pin_read(uuid, text, text, text, bigint) IS
'Pins the snapshot a (step, partition) of the leased run reads of a dataset: the first call '
'records the given snapshot (NULL: the table has none, and stays empty for that step), every '
'later call, from any retry or resume of the run, returns that same snapshot. The SDK''s scan '
'calls it. Errors: OR016 unknown step or partition, OR017 the step does not declare the '
'dataset in its reads.';

CREATE FUNCTION orca.record_commit(lease uuid, step text, partition text, dataset text,
                                   snapshot bigint, commit_no integer,
                                   operation text DEFAULT 'append')
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_org bigint := orca.current_org_id();
    a orca.attempts;
    v_new integer;
BEGIN
    IF record_commit.snapshot IS NULL OR record_commit.commit_no IS NULL
       OR record_commit.commit_no < 1 THEN
        RAISE EXCEPTION 'a commit needs a snapshot id and a commit number from 1, got % and %',
            coalesce(record_commit.snapshot::text, 'NULL'), coalesce(record_commit.commit_no::text, 'NULL')
            USING ERRCODE = 'OR050';
    END IF;
    IF coalesce(record_commit.operation, 'append') NOT IN ('append', 'replace', 'overwrite', 'delete') THEN
        RAISE EXCEPTION 'operation must be append, replace, overwrite or delete, got %',
            quote_literal(record_commit.operation)
            USING ERRCODE = 'OR050';
    END IF;
    a := orca._dataset_access(v_org, record_commit.lease, record_commit.step,
                              record_commit.partition, record_commit.dataset, 'write');
    INSERT INTO orca.commits (org_id, run_id, attempt_id, step, partition, dataset, snapshot_id,
                              commit_no, operation)
    VALUES (v_org, a.run_id, a.id, record_commit.step, record_commit.partition,
            record_commit.dataset, record_commit.snapshot, record_commit.commit_no,
            coalesce(record_commit.operation, 'append'))
    ON CONFLICT (run_id, step, partition, dataset, commit_no) DO NOTHING;
    GET DIAGNOSTICS v_new = ROW_COUNT;
    IF v_new > 0 THEN
        PERFORM orca._event(v_org, 'dataset.committed', (SELECT pipeline_id FROM orca.runs WHERE id = a.run_id),
            a.run_id, a.id,
            jsonb_build_object('dataset', record_commit.dataset, 'snapshot', record_commit.snapshot,
                               'operation', coalesce(record_commit.operation, 'append'),
                               'step', record_commit.step, 'partition', record_commit.partition));
    END IF;
END
$$;
COMMENT ON FUNCTION orca.record_commit(uuid, text, text, text, bigint, integer, text) IS
'Records a snapshot a (step, partition) of the leased run committed to a dataset, as its '
'commit_no-th commit. Recording the same commit again changes nothing. The SDK''s append and '
'commit call it right after the table commit. Errors: OR016, OR017 (not in the step''s '
'writes), OR050.';

CREATE FUNCTION orca.lineage(dataset text)
RETURNS TABLE (direction text, depth integer, related text, via text, pipeline text, run bigint,
               read_snapshot bigint, commit_snapshot bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_org bigint := orca.current_org_id();
BEGIN
    IF lineage.dataset IS NULL OR NOT (lineage.dataset ~ '^[a-z_][a-z0-9_]*\.[a-z_][a-z0-9_]*$') THEN
        RAISE EXCEPTION 'malformed dataset %: write namespace.table', quote_nullable(lineage.dataset)
            USING ERRCODE = 'OR050';
    END IF;
    RETURN QUERY
    WITH RECURSIVE anc (version_id, step, ancestor) AS (
        -- Each step with itself and every step upstream of it (its after, ...).
        SELECT s.version_id, s.name, s.name FROM orca.steps s WHERE s.org_id = v_org
        UNION
        SELECT a.version_id, a.step, s.after
        FROM anc a JOIN orca.steps s ON s.version_id = a.version_id AND s.name = a.ancestor
        WHERE s.after IS NOT NULL
    ), e AS (
        -- A commit depends on what its step, and the steps upstream of it in
        -- the same run, read.
        SELECT DISTINCT r.run_id, r.dataset AS src, r.snapshot_id AS src_snap,
               c.dataset AS dst, c.snapshot_id AS dst_snap
        FROM orca.commits c
        JOIN orca.runs ru ON ru.id = c.run_id
        JOIN anc ON anc.version_id = ru.version_id AND anc.step = c.step
        JOIN orca.reads r ON r.run_id = c.run_id AND r.step = anc.ancestor
                         AND r.dataset <> c.dataset
        WHERE c.org_id = v_org
    ), up (depth, related, via, run_id, read_snap, commit_snap, seen) AS (
        SELECT 1, e.src, e.dst, e.run_id, e.src_snap, e.dst_snap, ARRAY[lineage.dataset, e.src]
        FROM e WHERE e.dst = lineage.dataset
        UNION ALL
        SELECT u.depth + 1, e.src, e.dst, e.run_id, e.src_snap, e.dst_snap, u.seen || e.src
        FROM up u JOIN e ON e.dst = u.related
        WHERE u.depth < 10 AND NOT (e.src = ANY (u.seen))
    ), down (depth, related, via, run_id, read_snap, commit_snap, seen) AS (
        SELECT 1, e.dst, e.src, e.run_id, e.src_snap, e.dst_snap, ARRAY[lineage.dataset, e.dst]
        FROM e WHERE e.src = lineage.dataset
        UNION ALL
        SELECT d.depth + 1, e.dst, e.src, e.run_id, e.src_snap, e.dst_snap, d.seen || e.dst
        FROM down d JOIN e ON e.src = d.related
        WHERE d.depth < 10 AND NOT (e.dst = ANY (d.seen))
    ), walked AS (
        SELECT DISTINCT 'upstream'::text AS dir, u.depth, u.related, u.via, u.run_id, u.read_snap, u.commit_snap FROM up u
        UNION
        SELECT DISTINCT 'downstream', d.depth, d.related, d.via, d.run_id, d.read_snap, d.commit_snap FROM down d
    )
    SELECT w.dir, w.depth, w.related, w.via, p.name, w.run_id, w.read_snap, w.commit_snap
    FROM walked w
    JOIN orca.runs r ON r.id = w.run_id
    JOIN orca.pipelines p ON p.id = r.pipeline_id
    ORDER BY 1 DESC, 2, 3, 6, 8;
END
$$;
COMMENT ON FUNCTION orca.lineage(text) IS
'Upstream and downstream of a dataset, from the recorded reads and commits (a commit depends '
'on what its step and the steps upstream of it in the same run read): each row is a '
'related dataset at some depth, the dataset it connects to (via), the pipeline and run that '
'connected them, the snapshot the run read and the snapshot it committed. '
'Example: SELECT * FROM orca.lineage(''lake.clean'');';

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

---------------------------------------------------------------------------
-- Sensors
---------------------------------------------------------------------------

CREATE FUNCTION orca.sense_context(lease uuid) RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_org bigint := orca.current_org_id();
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
    v_org bigint := orca.current_org_id();
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

---------------------------------------------------------------------------
-- Time: all periodic work
---------------------------------------------------------------------------

CREATE FUNCTION orca.tick(now timestamptz DEFAULT now()) RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now     timestamptz := tick.now;
    v_orgs    bigint[] := orca._tick_orgs();
    v_max     integer := orca._max_fires_per_tick();
    s         record;
    a         record;
    q         record;
    sn        record;
    c         record;
    v_cursor  bigint;
    v_sense_run bigint;
    n_sensed  integer := 0;
    n_polls   integer := 0;
    v_from    timestamptz;
    v_until   timestamptz;
    v_fires   timestamptz[];
    v_fire    timestamptz;
    v_part    text;
    v_id      bigint;
    v_ids     bigint[];
    v_missed  integer;
    n_fires   integer := 0;
    n_runs    integer := 0;
    n_skipped integer := 0;
    n_missed  integer := 0;
    n_lost    integer := 0;
    n_started integer := 0;
BEGIN
    IF v_now IS NULL OR NOT isfinite(v_now) THEN
        RAISE EXCEPTION 'now must be a finite timestamp, got %', coalesce(v_now::text, 'NULL')
            USING ERRCODE = 'OR050';
    END IF;

    -- 1. Due cron fires become runs. SKIP LOCKED: a concurrent tick takes the
    --    schedules this one holds, and the unique index on (pipeline, fire_at)
    --    keeps a fire to one run whatever happens.
    FOR s IN
        SELECT sc.*, p.paused, v.id AS version_id, v.partition_kind, v.partition_start,
               v.run_retries
        FROM orca.schedules sc
        JOIN orca.pipelines p ON p.id = sc.pipeline_id
        JOIN orca.pipeline_versions v ON v.id = p.current_version
        WHERE sc.org_id = ANY (v_orgs)
        ORDER BY sc.pipeline_id
        FOR UPDATE OF sc SKIP LOCKED
    LOOP
        v_from := coalesce(s.fired_until, least(s.registered_at, v_now));
        IF v_now <= v_from THEN
            IF s.fired_until IS NULL THEN
                -- The schedule's first tick: its clock starts here.
                UPDATE orca.schedules SET fired_until = v_from WHERE pipeline_id = s.pipeline_id;
            END IF;
            CONTINUE;
        END IF;
        v_until := v_now;
        v_fires := orca._cron_fires(s.cron, s.tz, v_from, v_now, v_max + 1);
        IF NOT s.catchup THEN
            -- Only the latest of the fires missed while nothing ticked.
            v_missed := least(cardinality(v_fires), v_max) - 1;
            v_fires := coalesce(ARRAY[orca._cron_last(s.cron, s.tz, v_from, v_now)], '{}');
            v_fires := array_remove(v_fires, NULL);
            IF v_missed > 0 THEN
                n_missed := n_missed + v_missed;
                PERFORM orca._event(s.org_id, 'schedule.missed', s.pipeline_id, NULL, NULL,
                    jsonb_build_object('missed', v_missed, 'capped_at', v_max, 'from', v_from,
                                       'until', v_now, 'kept', v_fires[1]));
            END IF;
        ELSIF cardinality(v_fires) > v_max THEN
            -- More than one tick may make: the rest waits for the next tick.
            v_fires := v_fires[1:v_max];
            v_until := v_fires[v_max];
        END IF;
        v_ids := '{}';
        IF NOT s.paused THEN
            FOREACH v_fire IN ARRAY coalesce(v_fires, '{}') LOOP
                n_fires := n_fires + 1;
                v_part := orca._fire_partition_of(s.partition_kind, s.partition_start, s.fills,
                                                  s.tz, v_fire);
                IF v_part IS NULL THEN
                    n_skipped := n_skipped + 1;
                    PERFORM orca._event(s.org_id, 'fire.skipped', s.pipeline_id, NULL, NULL,
                        jsonb_build_object('fire_at', v_fire,
                                           'reason', 'its partition precedes the pipeline''s first, '
                                                     || s.partition_start));
                    CONTINUE;
                END IF;
                v_id := NULL;
                INSERT INTO orca.runs (org_id, pipeline_id, version_id, partitions, trigger,
                                       fire_at, run_retries, kind)
                VALUES (s.org_id, s.pipeline_id, s.version_id, ARRAY[v_part], 'schedule',
                        v_fire, s.run_retries,
                        CASE WHEN s.partition_kind = 'sync' THEN 'sync' ELSE 'pipeline' END)
                ON CONFLICT (pipeline_id, fire_at) WHERE fire_at IS NOT NULL DO NOTHING
                RETURNING id INTO v_id;
                IF v_id IS NOT NULL THEN
                    v_ids := v_ids || v_id;
                END IF;
            END LOOP;
        END IF;
        UPDATE orca.schedules
        SET fired_until = v_until,
            last_fire_at = coalesce(v_fires[cardinality(v_fires)], last_fire_at)
        WHERE pipeline_id = s.pipeline_id;
        n_runs := n_runs + cardinality(v_ids);
        PERFORM orca._runs_created(s.org_id, s.pipeline_id, v_ids);
    END LOOP;

    -- 2. Leases whose deadline passed are lost; their runs retry while the
    --    lost-attempt budget lasts.
    FOR a IN
        SELECT l.attempt_id AS id, l.deadline, l.runner FROM orca.leases l
        WHERE l.deadline < v_now AND l.org_id = ANY (v_orgs)
        ORDER BY l.attempt_id
        LIMIT 10000
    LOOP
        DECLARE
            l orca.attempts := orca._lock_attempt(a.id);
        BEGIN
            -- Re-checked under the lock: a heartbeat or finish may have won.
            IF l.status = 'leased' AND EXISTS (SELECT 1 FROM orca.leases x
                                               WHERE x.attempt_id = a.id AND x.deadline < v_now) THEN
                PERFORM orca._attempt_ended(l.id, 'lost',
                    format('lease expired at %s without a heartbeat from runner %s',
                           a.deadline, a.runner));
                n_lost := n_lost + 1;
            END IF;
        END;
    END LOOP;

    -- 3. Sensors: snapshots other pipelines' succeeded runs committed start
    --    runs now; outside snapshots are found by polls runners run.
    FOR sn IN
        SELECT x.*, v.id AS version_id, v.keys_dataset
        FROM orca.sensors x
        JOIN orca.pipelines p ON p.id = x.pipeline_id
        JOIN orca.pipeline_versions v ON v.id = p.current_version
        WHERE x.org_id = ANY (v_orgs) AND NOT p.paused AND v.sensor
        ORDER BY x.pipeline_id
        FOR UPDATE OF x SKIP LOCKED
    LOOP
        v_cursor := sn.commit_cursor;
        FOR c IN
            SELECT cm.id, cm.dataset, cm.snapshot_id, cm.partition, r.status, r.partitions AS run_partitions,
                   r.pipeline_id
            FROM orca.commits cm JOIN orca.runs r ON r.id = cm.run_id
            WHERE cm.org_id = sn.org_id AND cm.id > sn.commit_cursor
            ORDER BY cm.id
            LIMIT 1000
        LOOP
            -- A commit of a run still going is seen once the run has succeeded.
            EXIT WHEN c.status IN ('queued', 'running');
            v_cursor := c.id;
            CONTINUE WHEN c.status <> 'succeeded' OR c.pipeline_id = sn.pipeline_id;
            CONTINUE WHEN c.dataset IS DISTINCT FROM coalesce(sn.keys_dataset, c.dataset);
            CONTINUE WHEN NOT EXISTS (
                SELECT 1 FROM orca.step_datasets d
                WHERE d.version_id = sn.version_id AND d.dataset = c.dataset AND d.mode = 'read')
              OR EXISTS (
                SELECT 1 FROM orca.step_datasets d
                WHERE d.version_id = sn.version_id AND d.dataset = c.dataset AND d.mode = 'write');
            IF orca._sensed(sn.org_id, sn.pipeline_id, c.dataset, c.snapshot_id, 'orca',
                            CASE WHEN c.partition = '*' THEN c.run_partitions
                                 ELSE ARRAY[c.partition] END) IS NOT NULL THEN
                n_sensed := n_sensed + 1;
            END IF;
        END LOOP;
        UPDATE orca.sensors SET commit_cursor = v_cursor WHERE pipeline_id = sn.pipeline_id;
        -- The next poll, when one is due and none is waiting or running.
        IF sn.last_sense_at IS NULL
           OR sn.last_sense_at <= v_now - make_interval(secs => orca._sense_seconds()) THEN
            v_sense_run := sn.sense_run;
            IF v_sense_run IS NULL OR NOT EXISTS (
                   SELECT 1 FROM orca.runs WHERE id = v_sense_run AND status = 'running') THEN
                INSERT INTO orca.runs (org_id, pipeline_id, version_id, partitions, trigger, kind,
                                       status, started_at)
                VALUES (sn.org_id, sn.pipeline_id, sn.version_id, ARRAY['*'], 'sense', 'sense',
                        'running', now())
                RETURNING id INTO v_sense_run;
                UPDATE orca.sensors SET sense_run = v_sense_run WHERE pipeline_id = sn.pipeline_id;
            END IF;
            IF NOT EXISTS (SELECT 1 FROM orca.attempts
                           WHERE run_id = v_sense_run AND status IN ('pending', 'leased')) THEN
                PERFORM orca._queue_sense(v_sense_run);
                UPDATE orca.sensors SET last_sense_at = v_now WHERE pipeline_id = sn.pipeline_id;
                n_polls := n_polls + 1;
            END IF;
        END IF;
    END LOOP;

    -- 4. Queued runs start within their pipeline's max_runs.
    FOR q IN
        SELECT DISTINCT r.org_id, r.pipeline_id FROM orca.runs r
        WHERE r.status = 'queued' AND r.org_id = ANY (v_orgs)
    LOOP
        n_started := n_started + orca._start_queued(q.org_id, q.pipeline_id);
    END LOOP;

    RETURN jsonb_build_object(
        'now', v_now, 'fires', n_fires, 'runs_created', n_runs, 'fires_skipped', n_skipped,
        'fires_missed', n_missed, 'attempts_lost', n_lost, 'runs_started', n_started,
        'sensor_runs', n_sensed, 'sense_polls', n_polls);
END
$$;
COMMENT ON FUNCTION orca.tick(timestamptz) IS
'Does all periodic work at instant now: due cron fires become runs (one per fire, whatever '
'the number of ticks), leases past their deadline are lost and their runs retried, queued '
'runs start within max_runs, sensors start runs for new snapshots and queue their polls. '
'Idempotent for the same now. The background worker calls it '
'every orca.tick_ms; without it, call it from cron, a runner or a test. An admin who set no '
'orca.org ticks every org; anyone else ticks the session''s org. Returns counts.';

---------------------------------------------------------------------------
-- Keyed pipelines
---------------------------------------------------------------------------

CREATE FUNCTION orca.keys_context(lease uuid) RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_org bigint := orca.current_org_id();
    a orca.attempts;
    r orca.runs;
BEGIN
    a := orca._live_attempt(v_org, keys_context.lease);
    SELECT * INTO r FROM orca.runs WHERE id = a.run_id;
    IF r.kind <> 'keys' THEN
        RAISE EXCEPTION 'lease % is not a keys task: run % is a % run', keys_context.lease, r.id, r.kind
            USING ERRCODE = 'OR050';
    END IF;
    RETURN jsonb_build_object(
        'pipeline', (SELECT name FROM orca.pipelines WHERE id = r.pipeline_id),
        'run', r.id, 'attempt', a.number,
        'registry_hash', (SELECT registry_hash FROM orca.pipeline_versions WHERE id = r.version_id))
        || r.request;
END
$$;
COMMENT ON FUNCTION orca.keys_context(uuid) IS
'What a keys task asks for: the pipeline, its keys dataset and column, and the mode (all: queue '
'runs for every key not done; new: for the keys a sensor''s snapshot added; refresh: only read '
'them). The SDK''s keys command calls it.';

CREATE FUNCTION orca.report_keys(lease uuid, snapshot bigint, snapshot_ms bigint, keys text[])
RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_org bigint := orca.current_org_id();
    a orca.attempts;
    r orca.runs;
    p orca.pipelines;
    v_bad text;
    v_gen integer;
    v_stale boolean;
    v_new integer := 0;
    v_todo text[];
    v_runs bigint[] := '{}';
BEGIN
    a := orca._leased_attempt(v_org, report_keys.lease);
    SELECT * INTO r FROM orca.runs WHERE id = a.run_id;
    IF r.kind <> 'keys' THEN
        RAISE EXCEPTION 'lease % is not a keys task: run % is a % run', report_keys.lease, r.id, r.kind
            USING ERRCODE = 'OR050';
    END IF;
    IF report_keys.keys IS NULL THEN
        RAISE EXCEPTION 'keys must be an array (empty when the table has no rows), got NULL'
            USING ERRCODE = 'OR050';
    END IF;
    SELECT k INTO v_bad FROM unnest(report_keys.keys) AS k
    WHERE k IS NULL OR NOT (k ~ '^[A-Za-z0-9._:-]{1,128}$') LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'malformed partition %: expected a key: 1 to 128 bytes of letters, digits and ._:- (a value of %.%)',
                        quote_nullable(v_bad), r.request->>'dataset', r.request->>'column'
            USING ERRCODE = 'OR020',
                  HINT = 'a keyed pipeline''s keys column may hold only such names';
    END IF;
    -- One report at a time per pipeline: the key set moves in one order.
    SELECT * INTO p FROM orca.pipelines WHERE id = r.pipeline_id FOR UPDATE;
    -- A snapshot older than the one last read does not roll the keys back.
    v_stale := p.keys_snapshot_ms IS NOT NULL
               AND coalesce(report_keys.snapshot_ms, 0) < p.keys_snapshot_ms;
    IF NOT v_stale THEN
        v_gen := p.keys_generation + 1;
        INSERT INTO orca.keys AS k (org_id, pipeline_id, key, generation, first_generation,
                                    first_snapshot)
        SELECT DISTINCT v_org, p.id, x, v_gen, v_gen, report_keys.snapshot
        FROM unnest(report_keys.keys) AS x
        ON CONFLICT (pipeline_id, key) DO UPDATE SET generation = excluded.generation;
        SELECT count(*) INTO v_new FROM orca.keys
        WHERE pipeline_id = p.id AND first_generation = v_gen;
        UPDATE orca.pipelines
        SET keys_generation = v_gen, keys_snapshot = report_keys.snapshot,
            keys_snapshot_ms = report_keys.snapshot_ms, keys_read_at = now()
        WHERE id = p.id
        RETURNING * INTO p;
    END IF;
    IF r.request->>'mode' = 'all' THEN
        v_todo := ARRAY(SELECT orca._keys_not_done(p.id));
        v_runs := orca._queue_key_runs(v_org, p.id, v_todo, 'backfill', r.id);
    ELSIF r.request->>'mode' = 'new' AND NOT v_stale THEN
        -- New against the keys read before. With none read before (the
        -- registration's read has not reported yet), every key is new: a key
        -- run twice is better than a key never run.
        v_todo := ARRAY(SELECT key FROM orca.keys
                        WHERE pipeline_id = p.id AND generation = v_gen
                          AND first_generation = v_gen
                        ORDER BY key);
        v_runs := orca._queue_key_runs(v_org, p.id, v_todo, 'sensor', r.id);
    END IF;
    PERFORM orca._event(v_org, 'keys.read', p.id, r.id, a.id,
        jsonb_build_object('dataset', r.request->>'dataset', 'snapshot', report_keys.snapshot,
                           'keys', cardinality(report_keys.keys), 'new', v_new,
                           'stale', v_stale, 'mode', r.request->>'mode', 'runs', cardinality(v_runs)));
    RETURN jsonb_build_object('keys', (SELECT count(*) FROM orca.keys
                                       WHERE pipeline_id = p.id AND generation = p.keys_generation),
                              'new', v_new, 'stale', v_stale, 'runs', to_jsonb(v_runs));
END
$$;
COMMENT ON FUNCTION orca.report_keys(uuid, bigint, bigint, text[]) IS
'A keys task reports the keys (distinct values of the keys column) of the snapshot it read, '
'with the snapshot''s id and timestamp (NULL and an empty array for a table with no snapshot). '
'They become the pipeline''s current keys, unless a newer snapshot was reported already; then '
'the task''s mode acts: all queues runs of keys_per_run for every key that is not done, new '
'for the keys this snapshot added. Returns {keys, new, stale, runs}. Errors: OR020 a value '
'that is not a key, OR012/OR014 a refused lease, OR050 a lease that is not a keys task.';

CREATE FUNCTION orca.refresh_keys(pipeline text) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_org bigint := orca.current_org_id();
    p orca.pipelines;
BEGIN
    p := orca._pipeline(v_org, refresh_keys.pipeline);
    IF (SELECT partition_kind FROM orca.pipeline_versions WHERE id = p.current_version) <> 'keyed' THEN
        RAISE EXCEPTION 'pipeline ''%'' is not keyed: its partitions are months or days', p.name
            USING ERRCODE = 'OR050';
    END IF;
    RETURN orca._keys_task(v_org, p.id, 'refresh', 'manual');
END
$$;
COMMENT ON FUNCTION orca.refresh_keys(text) IS
'Queues a keys task that reads a keyed pipeline''s keys from the current snapshot of its keys '
'dataset, and returns its run id; it queues no runs. Registration does this once by itself. '
'Example: SELECT orca.refresh_keys(''labels'');';

CREATE FUNCTION orca.key_status(pipeline text)
RETURNS TABLE (key text, done boolean, active_run bigint, first_seen_at timestamptz,
               first_snapshot bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_org bigint := orca.current_org_id();
    p orca.pipelines;
BEGIN
    p := orca._pipeline(v_org, key_status.pipeline);
    RETURN QUERY
    WITH todo AS (SELECT orca._keys_not_done(p.id) AS key)
    SELECT k.key, NOT EXISTS (SELECT 1 FROM todo t WHERE t.key = k.key),
           (SELECT max(r.id) FROM orca.runs r
            WHERE r.pipeline_id = p.id AND r.kind = 'pipeline'
              AND r.status IN ('queued', 'running') AND k.key = ANY (r.partitions)),
           k.first_seen_at, k.first_snapshot
    FROM orca.keys k
    WHERE k.pipeline_id = p.id AND k.generation = p.keys_generation
    ORDER BY k.key;
END
$$;
COMMENT ON FUNCTION orca.key_status(text) IS
'The current keys of a keyed pipeline (from the last snapshot of its keys dataset read), each '
'with whether it is done (every mapped step succeeded for it under the current registry '
'hash), the queued or running run that has it, and when it was first seen. '
'Example: SELECT * FROM orca.key_status(''labels'') WHERE NOT done;';

---------------------------------------------------------------------------
-- Syncs
---------------------------------------------------------------------------

CREATE FUNCTION orca.create_sync(name text, source jsonb, destination jsonb, streams jsonb,
                                 schedule text DEFAULT NULL, delivery text DEFAULT 'exactly_once',
                                 pool text DEFAULT 'default', run_retries integer DEFAULT 2)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_org bigint := orca.current_org_id();
    d     jsonb;
    v_id  bigint;
BEGIN
    IF create_sync.name IS NULL OR create_sync.source IS NULL OR create_sync.destination IS NULL
       OR create_sync.streams IS NULL OR create_sync.delivery IS NULL THEN
        RAISE EXCEPTION 'malformed sync: name, source, destination, streams and delivery must not be NULL'
            USING ERRCODE = 'OR063';
    END IF;
    IF create_sync.pool IS NULL OR create_sync.pool = '' OR length(create_sync.pool) > 128 THEN
        RAISE EXCEPTION 'malformed sync: pool must be a name of 1 to 128 characters, got %',
                        quote_nullable(create_sync.pool)
            USING ERRCODE = 'OR063';
    END IF;
    IF create_sync.run_retries IS NULL OR create_sync.run_retries NOT BETWEEN 0 AND 100 THEN
        RAISE EXCEPTION 'malformed sync: run_retries must be from 0 to 100, got %',
                        coalesce(create_sync.run_retries::text, 'NULL')
            USING ERRCODE = 'OR063';
    END IF;
    d := orca._unwrap(orca._sync_check(create_sync.name, create_sync.source,
                                       create_sync.destination, create_sync.streams,
                                       create_sync.schedule, create_sync.delivery));
    -- Defining a sync again replaces its definition; its HEAD and generation stay.
    INSERT INTO orca.syncs AS s (org_id, name, definition, delivery)
    VALUES (v_org, create_sync.name, d, d->>'delivery')
    ON CONFLICT (org_id, name) DO UPDATE SET definition = excluded.definition,
                                             delivery = excluded.delivery
    RETURNING s.id INTO v_id;
    PERFORM orca._sync_pipeline(v_org, create_sync.name, d, create_sync.schedule,
                                create_sync.pool, create_sync.run_retries);
    PERFORM orca._event(v_org, 'sync.defined', NULL, NULL, NULL,
        jsonb_build_object('sync', create_sync.name, 'id', v_id, 'delivery', d->>'delivery',
                           'streams', (SELECT jsonb_object_agg(x->>'name', x->>'delivery')
                                       FROM jsonb_array_elements(d->'streams') AS x),
                           'by', session_user));
    RETURN v_id;
END
$$;
COMMENT ON FUNCTION orca.create_sync(text, jsonb, jsonb, jsonb, text, text, text, integer) IS
'Defines (or redefines) a sync from a source to a destination over streams, and returns its id. '
'A sync is also a pipeline of the same name whose runs are its attempts, one at a time: on its '
'schedule (cron, UTC), by orca.run(name, ''now''), leased to the runners of its pool, which '
'run orca-engine; a failed run is tried again run_retries times. '
'Each stream''s delivery level is worked out from the destination''s class, the source''s '
'replay, the write mode and the primary key, and must reach the required level. Errors: '
'OR060 unknown connector, OR061 missing option, OR062 delivery level impossible for a stream, '
'OR063 malformed definition, OR065 a pipeline has the name, OR030/OR031 bad schedule. '
'docs/syncs.md lists the connectors. '
'Example: SELECT orca.create_sync(''shop'', ''{"type":"postgres","url":"postgres://db/shop"}'', '
'''{"type":"iceberg","namespace":"raw"}'', ''[{"name":"orders","table":"public.orders",'
'"cursor":"updated_at","primary_key":["id"]}]'');';

CREATE FUNCTION orca._sync(p_org bigint, p_name text) RETURNS orca.syncs
LANGUAGE plpgsql AS $$
DECLARE
    s orca.syncs;
BEGIN
    SELECT * INTO s FROM orca.syncs WHERE org_id = p_org AND name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown sync ''%'' in org ''%''', p_name,
                        (SELECT name FROM orca.orgs WHERE id = p_org)
            USING ERRCODE = 'OR064',
                  HINT = 'orca.syncs lists the defined syncs; orca.create_sync defines one';
    END IF;
    RETURN s;
END
$$;

-- The fence: only the attempt of the sync's current generation moves HEAD.
CREATE FUNCTION orca._owned(s orca.syncs, p_generation integer) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_generation <> s.generation THEN
        RAISE EXCEPTION 'attempt of generation % is fenced: sync ''%'' was claimed by generation %',
                        p_generation, s.name, s.generation
            USING ERRCODE = 'OR070',
                  HINT = 'a newer attempt owns the sync; this one must stop without committing';
    END IF;
END
$$;

CREATE FUNCTION orca.claim_sync(sync text, lease uuid DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_org bigint := orca.current_org_id();
    s orca.syncs;
    a orca.attempts;
    r orca.runs;
BEGIN
    -- A run's attempt says which run it is: its lease must be live and of
    -- this sync (locks run, then attempt, then the sync, as finish does).
    IF claim_sync.lease IS NOT NULL THEN
        a := orca._leased_attempt(v_org, claim_sync.lease);
        SELECT * INTO r FROM orca.runs WHERE id = a.run_id;
        IF r.kind <> 'sync'
           OR (SELECT p.name FROM orca.pipelines p WHERE p.id = r.pipeline_id) <> claim_sync.sync THEN
            RAISE EXCEPTION 'lease % is an attempt of run %, not of sync ''%''',
                            claim_sync.lease, r.id, claim_sync.sync
                USING ERRCODE = 'OR050';
        END IF;
    END IF;
    s := orca._sync(v_org, claim_sync.sync);
    UPDATE orca.syncs SET generation = generation + 1 WHERE id = s.id RETURNING * INTO s;
    PERFORM orca._event(v_org, 'sync.claimed', r.pipeline_id, r.id, a.id,
        jsonb_build_object('sync', s.name, 'generation', s.generation, 'epoch', s.head_epoch));
    RETURN jsonb_build_object('sync', s.name, 'generation', s.generation,
                              'epoch', s.head_epoch, 'record', s.head_record,
                              'definition', s.definition, 'run', r.id,
                              'request', coalesce(r.request, '{}'::jsonb));
END
$$;
COMMENT ON FUNCTION orca.claim_sync(text, uuid) IS
'An attempt claims a sync before it moves data: the sync''s generation goes up by one, which '
'fences every older attempt (their next orca.advance_head fails with OR070). Returns the new '
'generation, the HEAD epoch and record to recover from, the definition, and with the lease of '
'a run''s attempt (which must be live: OR012/OR014/OR015 otherwise) the run and its request '
'({"mode": "full"} for a backfill: read everything again).';

CREATE FUNCTION orca.advance_head(sync text, generation integer, epoch bigint, record text)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_org bigint := orca.current_org_id();
    s orca.syncs := orca._sync(v_org, advance_head.sync);
BEGIN
    IF advance_head.generation IS NULL OR advance_head.epoch IS NULL
       OR coalesce(advance_head.record, '') = '' THEN
        RAISE EXCEPTION 'advance_head needs a generation, an epoch and a record, got %, %, %',
            coalesce(advance_head.generation::text, 'NULL'), coalesce(advance_head.epoch::text, 'NULL'),
            quote_nullable(advance_head.record)
            USING ERRCODE = 'OR050';
    END IF;
    PERFORM orca._owned(s, advance_head.generation);
    IF advance_head.epoch <> s.head_epoch + 1 THEN
        RAISE EXCEPTION 'epoch % does not follow HEAD epoch % of sync ''%''',
                        advance_head.epoch, s.head_epoch, s.name
            USING ERRCODE = 'OR071',
                  HINT = 'epochs commit one at a time, in order';
    END IF;
    UPDATE orca.syncs
    SET head_epoch = advance_head.epoch, head_record = advance_head.record, head_at = now()
    WHERE id = s.id;
    PERFORM orca._event(v_org, 'sync.committed', NULL, NULL, NULL,
        jsonb_build_object('sync', s.name, 'generation', s.generation,
                           'epoch', advance_head.epoch, 'record', advance_head.record));
END
$$;
COMMENT ON FUNCTION orca.advance_head(text, integer, bigint, text) IS
'The commit point of an epoch: moves the sync''s HEAD to the checkpoint record of epoch '
'(HEAD epoch + 1), as a compare-and-swap under the row lock. An attempt whose generation is '
'no longer the sync''s gets OR070 (fenced) and changes nothing; an epoch out of order OR071.';

CREATE FUNCTION orca.rewind_head(sync text, generation integer, epoch bigint, record text)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_org bigint := orca.current_org_id();
    s orca.syncs := orca._sync(v_org, rewind_head.sync);
BEGIN
    IF rewind_head.generation IS NULL OR rewind_head.epoch IS NULL
       OR (rewind_head.epoch > 0 AND coalesce(rewind_head.record, '') = '') THEN
        RAISE EXCEPTION 'rewind_head needs a generation, an epoch and (past epoch 0) a record, got %, %, %',
            coalesce(rewind_head.generation::text, 'NULL'), coalesce(rewind_head.epoch::text, 'NULL'),
            quote_nullable(rewind_head.record)
            USING ERRCODE = 'OR050';
    END IF;
    PERFORM orca._owned(s, rewind_head.generation);
    IF rewind_head.epoch <> s.head_epoch - 1 THEN
        RAISE EXCEPTION 'cannot rewind sync ''%'' to epoch %: HEAD is at epoch %, and only its own epoch can be lost',
                        s.name, rewind_head.epoch, s.head_epoch
            USING ERRCODE = 'OR071';
    END IF;
    UPDATE orca.syncs
    SET head_epoch = rewind_head.epoch,
        head_record = CASE WHEN rewind_head.epoch = 0 THEN NULL ELSE rewind_head.record END,
        head_at = now()
    WHERE id = s.id;
    PERFORM orca._event(v_org, 'sync.rewound', NULL, NULL, NULL,
        jsonb_build_object('sync', s.name, 'generation', s.generation, 'lost_epoch', s.head_epoch,
                           'epoch', rewind_head.epoch, 'record', rewind_head.record));
END
$$;
COMMENT ON FUNCTION orca.rewind_head(text, integer, bigint, text) IS
'Recovery''s way back when HEAD''s epoch is lost (nothing of it is visible and its staged files '
'are gone): moves HEAD back to the record of the epoch before (HEAD epoch - 1; NULL record for '
'epoch 0), so the attempt reads that epoch again from there. Fenced like orca.advance_head '
'(OR070); any other epoch is OR071.';
