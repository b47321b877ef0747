-- Runs: queueing them (run, backfill), starting them within max_runs,
-- cancelling and retrying them.

-- A partition spec expanded against the pipeline's current version.
CREATE FUNCTION orca._partitions(p orca.pipelines, p_spec text) RETURNS text[]
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v orca.pipeline_versions;
BEGIN
    IF p_spec IS NULL THEN
        RAISE EXCEPTION 'malformed partition list: partitions must not be NULL'
            USING ERRCODE = 'OR021';
    END IF;
    SELECT * INTO v FROM orca.pipeline_versions WHERE id = p.current_version;
    RETURN ARRAY(
        SELECT jsonb_array_elements_text(orca._unwrap(orca._expand_partitions(
            p.name, v.partition_kind, v.partition_start, v.tz, p_spec, now()))));
END
$$;

-- What a runner runs for an attempt of a run of this kind: the binary's
-- attempt, sense or keys command, or orca-engine's sync, discover or maintain.
CREATE FUNCTION orca._command(p_kind text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE p_kind WHEN 'sense' THEN 'sense' WHEN 'keys' THEN 'keys'
                       WHEN 'sync' THEN 'sync' WHEN 'discover' THEN 'discover'
                       WHEN 'maintain' THEN 'maintain' ELSE 'attempt' END
$$;

-- The size of a run's next attempt, from its version's resources (the
-- manifest's, normalised by orca_core::resources): the declared CPU, and
-- memory never below what the run's last attempt had; after a kill for
-- memory, that times memory_growth, up to max_memory_bytes.
CREATE FUNCTION orca._attempt_size(p_res jsonb, p_run bigint) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_strip_nulls(jsonb_build_object(
        'cpu_millis', p_res->'cpu_millis',
        'memory_bytes', CASE
            WHEN NOT p_res ? 'memory_bytes' THEN NULL
            WHEN last.resources IS NULL THEN (p_res->>'memory_bytes')::bigint
            WHEN last.killed_for = 'memory' THEN
                least(ceil((last.resources->>'memory_bytes')::numeric
                           * (p_res->>'memory_growth')::numeric)::bigint,
                      (p_res->>'max_memory_bytes')::bigint)
            ELSE greatest((p_res->>'memory_bytes')::bigint,
                          least((last.resources->>'memory_bytes')::bigint,
                                (p_res->>'max_memory_bytes')::bigint))
        END))
    FROM (SELECT 1) one
    LEFT JOIN LATERAL (
        SELECT a.killed_for, a.resources FROM orca.attempts a
        WHERE a.run_id = p_run AND a.resources ? 'memory_bytes'
        ORDER BY a.number DESC LIMIT 1
    ) last ON true
$$;

-- Each run's next attempt, pending in its pool: the attempt (numbered by the
-- run's attempts, which the caller has just counted up) and its queue row,
-- and a NOTIFY that wakes the pool's idle runners (sent at commit, once per
-- payload). The one place attempts are made. p_version: the version the
-- attempts run; NULL for each run's own.
CREATE FUNCTION orca._enqueue_attempts(p_runs bigint[], p_version bigint DEFAULT NULL)
RETURNS SETOF orca.attempts
LANGUAGE plpgsql AS $$
DECLARE
    v_made orca.attempts[];
BEGIN
    WITH att AS (
        INSERT INTO orca.attempts (org_id, run_id, number, version_id, pool, resources)
        SELECT r.org_id, r.id, r.attempts, v.id, v.pool,
               CASE WHEN v.manifest ? 'resources'
                    THEN orca._attempt_size(v.manifest->'resources', r.id) END
        FROM orca.runs r JOIN orca.pipeline_versions v ON v.id = coalesce(p_version, r.version_id)
        WHERE r.id = ANY (p_runs)
        -- Attempts are claimed oldest first: the oldest run's comes first.
        ORDER BY r.id
        RETURNING *
    ), q AS (
        -- The run's kind by primary key, a row at a time (a subquery in the
        -- select list, which the planner cannot turn into a join): a join
        -- let it hash the whole runs table, whose size is the history.
        INSERT INTO orca.queue (org_id, pool, attempt_id, command)
        SELECT a.org_id, a.pool, a.id,
               orca._command((SELECT x.kind FROM orca.runs x WHERE x.id = a.run_id))
        FROM att a
    )
    SELECT array_agg(a ORDER BY a.id) INTO v_made FROM att a;
    PERFORM pg_notify('orca_work', p)
    FROM (SELECT DISTINCT x.pool AS p FROM unnest(v_made) x) pools;
    RETURN QUERY SELECT * FROM unnest(v_made);
END
$$;

-- Starts queued runs now: each gets its next attempt, pending in its pool.
-- Returns how many started.
CREATE FUNCTION orca._start_runs(p_runs bigint[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_started bigint[];
BEGIN
    IF p_runs IS NULL OR cardinality(p_runs) = 0 THEN
        RETURN 0;
    END IF;
    WITH started AS (
        UPDATE orca.runs r
        SET status = 'running', started_at = coalesce(r.started_at, now()), attempts = r.attempts + 1
        WHERE r.id = ANY (p_runs) AND r.status = 'queued'
        RETURNING r.id
    )
    SELECT array_agg(id) INTO v_started FROM started;
    IF v_started IS NULL THEN
        RETURN 0;
    END IF;
    -- The run's pipeline by primary key, a row at a time (a subquery in the
    -- select list, which the planner cannot turn into a join): joined, it
    -- hashed the whole runs table on every start, whose size is the history.
    INSERT INTO orca.events (org_id, kind, pipeline_id, run_id, attempt_id, data)
    SELECT a.org_id, 'run.started',
           (SELECT x.pipeline_id FROM orca.runs x WHERE x.id = a.run_id), a.run_id, a.id,
           jsonb_build_object('attempt', a.number, 'pool', a.pool)
    FROM orca._enqueue_attempts(v_started) a
    ORDER BY a.id;
    RETURN cardinality(v_started);
END
$$;

-- The runs that hold a pipeline's max_runs slots: its running pipeline and
-- sync runs (a sensor's poll, a keys task and maintenance hold none).
-- _start_queued decides with it, and orca.explain names them with it.
CREATE FUNCTION orca._max_runs_holders(p_pipeline bigint) RETURNS bigint[]
LANGUAGE sql STABLE AS $$
    SELECT coalesce(array_agg(id ORDER BY id), '{}') FROM orca.runs
    WHERE pipeline_id = p_pipeline AND status = 'running' AND kind IN ('pipeline', 'sync')
$$;

-- Starts the oldest queued runs of a pipeline that fit under its max_runs.
CREATE FUNCTION orca._start_queued(p_org bigint, p_pipeline bigint) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_max     integer;
    v_paused  boolean;
    v_running integer := 0;
    v_ids     bigint[];
BEGIN
    IF NOT EXISTS (SELECT 1 FROM orca.runs
                   WHERE pipeline_id = p_pipeline AND status = 'queued') THEN
        RETURN 0;
    END IF;
    -- Serialises starts per pipeline so that concurrent calls respect max_runs.
    SELECT max_runs, paused INTO v_max, v_paused
    FROM orca.pipelines WHERE id = p_pipeline AND org_id = p_org FOR UPDATE;
    IF v_paused THEN
        RETURN 0;
    END IF;
    IF v_max IS NOT NULL THEN
        v_running := cardinality(orca._max_runs_holders(p_pipeline));
        IF v_running >= v_max THEN
            RETURN 0;
        END IF;
    END IF;
    SELECT array_agg(id ORDER BY id) INTO v_ids
    FROM (SELECT id FROM orca.runs
          WHERE pipeline_id = p_pipeline AND status = 'queued'
          ORDER BY id
          LIMIT CASE WHEN v_max IS NULL THEN NULL ELSE v_max - v_running END) q;
    RETURN orca._start_runs(v_ids);
END
$$;

-- A run of the pipeline ended: a queued one may take its place. Only a
-- pipeline with max_runs has queued runs that wait for a slot (a paused one
-- starts them when unpaused), so the common uncapped case costs one lookup.
CREATE FUNCTION orca._slot_freed(p_org bigint, p_pipeline bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT max_runs IS NOT NULL FROM orca.pipelines WHERE id = p_pipeline) THEN
        PERFORM orca._start_queued(p_org, p_pipeline);
    END IF;
END
$$;

-- New runs' (step, partition) states and their run.queued events, in run
-- order.
CREATE FUNCTION orca._record_runs(p_runs bigint[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO orca.step_states (org_id, run_id, step, partition)
    SELECT r.org_id, r.id, s.name, part
    FROM orca.runs r
    JOIN orca.steps s ON s.version_id = r.version_id
    CROSS JOIN LATERAL unnest(CASE WHEN s.kind = 'mapped' THEN r.partitions
                                   ELSE ARRAY['*'] END) AS part
    WHERE r.id = ANY (p_runs)
    ON CONFLICT DO NOTHING;
    INSERT INTO orca.events (org_id, kind, pipeline_id, run_id, data)
    SELECT r.org_id, 'run.queued', r.pipeline_id, r.id,
           jsonb_build_object('partitions', r.partitions, 'trigger', r.trigger,
                              'version_id', r.version_id, 'by', session_user)
    FROM orca.runs r WHERE r.id = ANY (p_runs)
    ORDER BY r.id;
END
$$;

-- Completes the creation of new runs: their (step, partition) states, their
-- run.queued events, and a start for those that fit.
CREATE FUNCTION orca._runs_created(p_org bigint, p_pipeline bigint, p_runs bigint[])
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_max    integer;
    v_paused boolean;
BEGIN
    IF p_runs IS NULL OR cardinality(p_runs) = 0 THEN
        RETURN;
    END IF;
    PERFORM orca._record_runs(p_runs);
    SELECT max_runs, paused INTO v_max, v_paused FROM orca.pipelines WHERE id = p_pipeline;
    IF v_max IS NULL AND NOT v_paused THEN
        PERFORM orca._start_runs(p_runs);
    ELSE
        PERFORM orca._start_queued(p_org, p_pipeline);
    END IF;
END
$$;

-- What _runs_created does, for runs of any number of pipelines at once
-- (a tick's fires): their step states and run.queued events; then the runs
-- made running (those of pipelines without a cap) get their attempts and
-- run.started events together, and each capped pipeline starts what its
-- cap allows. Runs are never made for a paused pipeline by a tick.
CREATE FUNCTION orca._runs_created_many(p_runs bigint[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_running bigint[];
    p         record;
BEGIN
    IF p_runs IS NULL OR cardinality(p_runs) = 0 THEN
        RETURN;
    END IF;
    PERFORM orca._record_runs(p_runs);
    SELECT array_agg(r.id ORDER BY r.id) INTO v_running
    FROM orca.runs r WHERE r.id = ANY (p_runs) AND r.status = 'running';
    IF v_running IS NOT NULL THEN
        -- The run's pipeline by primary key, a row at a time (as
        -- orca._start_runs does, for the same reason).
        INSERT INTO orca.events (org_id, kind, pipeline_id, run_id, attempt_id, data)
        SELECT a.org_id, 'run.started',
               (SELECT x.pipeline_id FROM orca.runs x WHERE x.id = a.run_id), a.run_id, a.id,
               jsonb_build_object('attempt', a.number, 'pool', a.pool)
        FROM orca._enqueue_attempts(v_running) a
        ORDER BY a.id;
    END IF;
    FOR p IN
        SELECT DISTINCT r.org_id, r.pipeline_id
        FROM orca.runs r
        WHERE r.id = ANY (p_runs) AND r.status = 'queued'
        ORDER BY r.pipeline_id
    LOOP
        PERFORM orca._start_queued(p.org_id, p.pipeline_id);
    END LOOP;
END
$$;

-- A running run's next attempt, after one failed or was lost.
CREATE FUNCTION orca._next_attempt(p_run bigint, p_reason text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    r orca.runs;
    a orca.attempts;
BEGIN
    UPDATE orca.runs SET attempts = attempts + 1 WHERE id = p_run RETURNING * INTO r;
    SELECT * INTO a FROM orca._enqueue_attempts(ARRAY[r.id]);
    PERFORM orca._event(r.org_id, 'run.retrying', r.pipeline_id, r.id, a.id,
                        jsonb_build_object('attempt', r.attempts, 'after', p_reason,
                                           'failures', r.failures, 'losses', r.losses));
END
$$;

-- Locks a run of the org, or raises OR011 naming it: a run of another org is
-- as unknown as one that does not exist.
CREATE FUNCTION orca._lock_run(p_org bigint, p_run bigint) RETURNS orca.runs
LANGUAGE plpgsql AS $$
DECLARE
    r orca.runs;
BEGIN
    SELECT * INTO r FROM orca.runs WHERE id = p_run AND org_id = p_org FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown run %', coalesce(p_run::text, 'NULL') USING ERRCODE = 'OR011';
    END IF;
    RETURN r;
END
$$;

CREATE FUNCTION orca.run(pipeline text, partitions text) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_bounded boolean := orca._bound('run', 'pipeline', octet_length(run.pipeline), 1024)
                         AND orca._bound('run', 'partitions', octet_length(run.partitions), 65536);
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

CREATE FUNCTION orca.backfill(pipeline text, partitions text, per_run integer DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_bounded boolean := orca._bound('backfill', 'pipeline', octet_length(backfill.pipeline), 1024)
                         AND orca._bound('backfill', 'partitions', octet_length(backfill.partitions), 65536);
    v_org bigint := orca.current_org_id();
    p orca.pipelines;
    v orca.pipeline_versions;
    v_parts text[];
    v_ids bigint[];
    v_active text[];
    v_sync_run bigint;
    v_per_run integer;
BEGIN
    p := orca._pipeline(v_org, backfill.pipeline);
    SELECT * INTO v FROM orca.pipeline_versions WHERE id = p.current_version;
    IF backfill.per_run IS NOT NULL AND v.partition_kind = 'sync' THEN
        RAISE EXCEPTION '''%'' is a sync: its backfill is one run, so it takes no per_run (got %)',
                        p.name, backfill.per_run
            USING ERRCODE = 'OR110',
                  HINT = format('SELECT orca.backfill(%L, ''@all'')', p.name);
    END IF;
    IF backfill.per_run IS NOT NULL
       AND (backfill.per_run < 1 OR backfill.per_run > orca._max_partitions()) THEN
        RAISE EXCEPTION 'per_run must be a number of partitions from 1 to % (orca.max_partitions), got %',
                        orca._max_partitions(), backfill.per_run
            USING ERRCODE = 'OR110',
                  HINT = format('SELECT orca.backfill(%L, %L, per_run => 12) queues runs of up to 12 partitions',
                                p.name, backfill.partitions);
    END IF;
    IF v.partition_kind = 'sync' THEN
        IF backfill.partitions IS DISTINCT FROM '@all' THEN
            RAISE EXCEPTION '''%'' is a sync: it backfills ''@all'' (every stream read again from its start), got %',
                            p.name, quote_nullable(backfill.partitions)
                USING ERRCODE = 'OR021',
                      HINT = format('SELECT orca.run(%L, ''now'') queues a run from the checkpoint', p.name);
        END IF;
        INSERT INTO orca.runs (org_id, pipeline_id, version_id, partitions, trigger, run_retries,
                               kind, request)
        VALUES (v_org, p.id, v.id, ARRAY[orca._fire_partition_of('sync', '', '', 'UTC', now())],
                'backfill', v.run_retries, 'sync', '{"mode": "full"}')
        RETURNING id INTO v_sync_run;
        PERFORM orca._runs_created(v_org, p.id, ARRAY[v_sync_run]);
        RETURN NEXT v_sync_run;
        RETURN;
    END IF;
    IF v.partition_kind = 'keyed' THEN
        v_parts := orca._key_names(p, backfill.partitions);
        IF v_parts IS NULL THEN
            -- Every key that is not done: which keys there are is for a read
            -- of the dataset to say, so a keys task queues the runs.
            RETURN NEXT orca._keys_task(v_org, p.id, 'all', 'backfill',
                                        jsonb_strip_nulls(jsonb_build_object('per_run', backfill.per_run)));
            RETURN;
        END IF;
        RETURN QUERY SELECT unnest(orca._queue_key_runs(v_org, p.id, v_parts, 'backfill', NULL,
                                                        backfill.per_run));
        RETURN;
    END IF;
    v_parts := orca._partitions(p, backfill.partitions);
    -- The pipeline's backfill policy (its manifest's backfill_per_run)
    -- unless the call names its own; one partition a run by default.
    v_per_run := coalesce(backfill.per_run, (v.manifest->>'backfill_per_run')::int, 1);
    -- A partition that already has a queued or running run is not queued twice.
    SELECT array_agg(DISTINCT x) INTO v_active
    FROM orca.runs r, unnest(r.partitions) AS x
    WHERE r.pipeline_id = p.id AND r.status IN ('queued', 'running') AND x = ANY (v_parts);
    WITH todo AS (
        SELECT x.part, x.ord FROM unnest(v_parts) WITH ORDINALITY AS x(part, ord)
        WHERE NOT (x.part = ANY (coalesce(v_active, '{}')))
    ), grouped AS (
        SELECT (row_number() OVER (ORDER BY t.ord) - 1) / v_per_run AS grp, t.part, t.ord
        FROM todo t
    ), ins AS (
        INSERT INTO orca.runs (org_id, pipeline_id, version_id, partitions, trigger, run_retries)
        SELECT v_org, p.id, v.id, array_agg(g.part ORDER BY g.ord), 'backfill', v.run_retries
        FROM grouped g GROUP BY g.grp ORDER BY g.grp
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
COMMENT ON FUNCTION orca.backfill(text, text, integer) IS
'Queues runs over the given partitions, oldest first, and returns their ids: one partition a '
'run, or up to per_run partitions a run (default: the pipeline''s backfill_per_run, else 1), '
'each run one attempt whose steps go through its partitions in turn. Partitions that already '
'have a queued or running run are skipped (with a NOTICE). partitions: ''2024-01..2024-06'' '
'(inclusive), ''2024-01,2024-03'' or ''@all'' (from the pipeline''s start to the current '
'partition). Example: SELECT orca.backfill(''lake'', ''2024-01..2024-06''); '
'SELECT orca.backfill(''lake'', ''2013-01..2014-12'', per_run => 12); '
'A keyed pipeline takes keys (''log-1,log-2''), queued in runs of per_run (default '
'keys_per_run), or ''@all'', which returns the id of a keys task (a run of kind keys): it reads '
'the keys dataset and queues runs of per_run (default keys_per_run) for every key that is not '
'done (runs.parent_run names it). '
'A sync (orca.create_sync) takes ''@all'': one run that reads every stream again from its '
'start (a merge converges, an append with _orca_id skipping adds only what it lacks). '
'Errors: OR010 unknown pipeline, OR020 to OR024 as orca.run, OR110 a per_run out of bounds '
'or given for a sync.';

CREATE FUNCTION orca.cancel(run bigint) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_org bigint := orca.current_org_id();
    r orca.runs;
BEGIN
    r := orca._lock_run(v_org, cancel.run);
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

-- Queues a failed or cancelled run of an org again (orca.retry, and a
-- retry_run playbook, whose `by` names it).
CREATE FUNCTION orca._retry_run(p_org bigint, p_run bigint, p_by text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    r orca.runs;
    v orca.pipeline_versions;
BEGIN
    r := orca._lock_run(p_org, p_run);
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
    PERFORM orca._event(p_org, 'run.retried', r.pipeline_id, r.id, NULL,
                        jsonb_build_object('was', r.status, 'version_id', v.id, 'by', p_by));
    IF r.kind = 'keys' THEN
        -- A keys task has no steps: it reads keys again and takes no run slot.
        PERFORM orca._start_runs(ARRAY[r.id]);
    ELSE
        PERFORM orca._runs_created(p_org, r.pipeline_id, ARRAY[r.id]);
    END IF;
    RETURN r.id;
END
$$;

CREATE FUNCTION orca.retry(run bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN orca._retry_run(orca.current_org_id(), retry.run, session_user);
END
$$;
COMMENT ON FUNCTION orca.retry(bigint) IS
'Queues a failed or cancelled run again, with the pipeline''s current version and a fresh '
'run_retries budget; returns the run id. Errors: OR011 unknown run, OR013 run not failed or cancelled.';

-- A NOTIFY on orca_runs_finished when runs end (sent at commit, once per
-- transaction however many ended: the payload is empty, so it says nothing
-- of any org's runs). What `orca backfill` waits on instead of looking at
-- its runs again and again.
CREATE FUNCTION orca._runs_finished() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('orca_runs_finished', '');
    RETURN NULL;
END
$$;
CREATE TRIGGER runs_finished AFTER UPDATE OF status ON orca.runs
FOR EACH ROW WHEN (OLD.status IN ('queued', 'running')
                   AND NEW.status IN ('succeeded', 'failed', 'cancelled'))
EXECUTE FUNCTION orca._runs_finished();
