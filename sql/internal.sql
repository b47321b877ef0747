-- Internal building blocks of the SQL API: the run and attempt lifecycle.
--
-- Nothing here is granted to anyone; the API functions in api.sql run as the
-- extension owner and call these with an org they already checked.
--
-- Lock order, to keep concurrent calls free of deadlocks: a pipeline row, then
-- a run row, then its attempts. orca.claim and orca.heartbeat lock only
-- attempts and never wait for a run.

-- Raises the error in a helper's envelope with its own SQLSTATE, or returns
-- the value it carries.
CREATE FUNCTION orca._unwrap(r jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF r ? 'error' THEN
        IF r->'error'->>'hint' IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = r->'error'->>'code', MESSAGE = r->'error'->>'message';
        END IF;
        RAISE EXCEPTION USING ERRCODE = r->'error'->>'code', MESSAGE = r->'error'->>'message',
                              HINT = r->'error'->>'hint';
    END IF;
    RETURN r->'ok';
END
$$;

-- A lease token is 64 random bits followed by the attempt's id: the random
-- half makes it unguessable, the id half finds the attempt by primary key.
CREATE FUNCTION orca._new_lease(p_attempt bigint) RETURNS uuid
LANGUAGE sql VOLATILE AS $$
    SELECT (left(replace(gen_random_uuid()::text, '-', ''), 16)
            || lpad(to_hex(p_attempt), 16, '0'))::uuid
$$;

CREATE FUNCTION orca._lease_attempt(p_lease uuid) RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT ('x' || right(replace(p_lease::text, '-', ''), 16))::bit(64)::bigint
$$;

-- PL/pgSQL rather than SQL for the small helpers below: it keeps their plans
-- across calls, where a non-inlined SQL function is planned on every call.
CREATE FUNCTION orca._is_admin() RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = session_user AND r.rolsuper)
        OR pg_catalog.pg_has_role(session_user, 'orca_admin', 'MEMBER');
END
$$;

-- The orgs orca.tick works on: every org for an admin who did not pick one,
-- otherwise the session's org.
CREATE FUNCTION orca._tick_orgs() RETURNS bigint[]
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF nullif(current_setting('orca.org', true), '') IS NULL AND orca._is_admin() THEN
        RETURN ARRAY(SELECT id FROM orca.orgs ORDER BY id);
    END IF;
    RETURN ARRAY[orca.current_org_id()];
END
$$;

CREATE FUNCTION orca._event(p_org bigint, p_kind text, p_pipeline bigint, p_run bigint,
                            p_attempt bigint, p_data jsonb DEFAULT '{}')
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO orca.events (org_id, kind, pipeline_id, run_id, attempt_id, data)
    VALUES (p_org, p_kind, p_pipeline, p_run, p_attempt, coalesce(p_data, '{}'));
END
$$;

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

-- The partition a fire fills; a sync's run is named by its fire instant.
CREATE FUNCTION orca._fire_partition_of(p_kind text, p_start text, p_fills text, p_tz text,
                                        p_fire timestamptz) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN p_kind = 'sync'
                THEN to_char(p_fire AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
                ELSE orca._fire_partition(p_kind, p_start, p_fills, p_tz, p_fire) END
$$;

-- Makes (or updates) the pipeline behind a sync: a version of partition kind
-- sync whose runs are the sync's attempts, one at a time, on its schedule.
CREATE FUNCTION orca._sync_pipeline(p_org bigint, p_name text, p_def jsonb, p_schedule text,
                                    p_pool text, p_retries integer) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_pid bigint;
    v_cur bigint;
    v_vid bigint;
    v_n   integer;
    v_hash text := md5(jsonb_build_object('d', p_def, 'pool', p_pool, 'retries', p_retries)::text);
BEGIN
    INSERT INTO orca.pipelines (org_id, name, max_runs) VALUES (p_org, p_name, 1)
    ON CONFLICT (org_id, name) DO NOTHING;
    SELECT id, current_version INTO v_pid, v_cur
    FROM orca.pipelines WHERE org_id = p_org AND name = p_name FOR UPDATE;
    IF v_cur IS NOT NULL
       AND (SELECT partition_kind FROM orca.pipeline_versions WHERE id = v_cur) <> 'sync' THEN
        RAISE EXCEPTION 'name ''%'' belongs to a pipeline; a sync needs a name of its own', p_name
            USING ERRCODE = 'OR065',
                  HINT = 'syncs and pipelines share one namespace per org: their runs are in orca.runs';
    END IF;
    SELECT id INTO v_vid FROM orca.pipeline_versions
    WHERE pipeline_id = v_pid AND registry_hash = v_hash ORDER BY id DESC LIMIT 1;
    IF v_vid IS NULL THEN
        SELECT coalesce(max(version), 0) + 1 INTO v_n
        FROM orca.pipeline_versions WHERE pipeline_id = v_pid;
        INSERT INTO orca.pipeline_versions (
            org_id, pipeline_id, version, registry_hash, manifest, binary_path, pool,
            partition_kind, partition_start, max_runs, run_retries, catchup, fills, cron, tz)
        VALUES (p_org, v_pid, v_n, v_hash, p_def, 'orca-engine', p_pool,
                'sync', '', 1, p_retries, false, 'current', p_schedule, 'UTC')
        RETURNING id INTO v_vid;
    END IF;
    -- One attempt at a time: a second would only fence the first.
    UPDATE orca.pipelines SET current_version = v_vid, max_runs = 1 WHERE id = v_pid;
    IF p_schedule IS NOT NULL THEN
        INSERT INTO orca.schedules (org_id, pipeline_id, cron, tz, fills, catchup)
        VALUES (p_org, v_pid, p_schedule, 'UTC', 'current', false)
        ON CONFLICT (pipeline_id) DO UPDATE SET cron = excluded.cron;
    ELSE
        DELETE FROM orca.schedules WHERE pipeline_id = v_pid;
    END IF;
    RETURN v_pid;
END
$$;

-- Starts queued runs now: each gets its next attempt, pending in its pool.
-- Returns how many started.
CREATE FUNCTION orca._start_runs(p_runs bigint[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_started integer;
    v_pools   text[];
BEGIN
    IF p_runs IS NULL OR cardinality(p_runs) = 0 THEN
        RETURN 0;
    END IF;
    WITH started AS (
        UPDATE orca.runs r
        SET status = 'running', started_at = coalesce(r.started_at, now()), attempts = r.attempts + 1
        WHERE r.id = ANY (p_runs) AND r.status = 'queued'
        RETURNING r.org_id, r.id, r.pipeline_id, r.version_id, r.attempts
    ), att AS (
        INSERT INTO orca.attempts (org_id, run_id, number, version_id, pool)
        SELECT s.org_id, s.id, s.attempts, s.version_id, v.pool
        FROM started s JOIN orca.pipeline_versions v ON v.id = s.version_id
        RETURNING org_id, id, run_id, number, pool
    ), q AS (
        INSERT INTO orca.queue (org_id, pool, attempt_id)
        SELECT org_id, pool, id FROM att
    ), ev AS (
        -- Joined to the runs table, not to the other CTE: two CTEs join by
        -- nested loop, quadratic for a backfill of thousands.
        INSERT INTO orca.events (org_id, kind, pipeline_id, run_id, attempt_id, data)
        SELECT a.org_id, 'run.started', r.pipeline_id, a.run_id, a.id,
               jsonb_build_object('attempt', a.number, 'pool', a.pool)
        FROM att a JOIN orca.runs r ON r.id = a.run_id
    )
    SELECT count(*), array_agg(DISTINCT pool) INTO v_started, v_pools FROM att;
    -- Wake idle runners of each pool; NOTIFY is sent at commit, once per payload.
    PERFORM pg_notify('orca_work', p) FROM unnest(v_pools) AS p;
    RETURN v_started;
END
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
        SELECT count(*) INTO v_running FROM orca.runs
        WHERE pipeline_id = p_pipeline AND status = 'running' AND kind IN ('pipeline', 'sync');
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
    FROM orca.runs r WHERE r.id = ANY (p_runs);
    SELECT max_runs, paused INTO v_max, v_paused FROM orca.pipelines WHERE id = p_pipeline;
    IF v_max IS NULL AND NOT v_paused THEN
        PERFORM orca._start_runs(p_runs);
    ELSE
        PERFORM orca._start_queued(p_org, p_pipeline);
    END IF;
END
$$;

-- A running run's next attempt, after one failed or was lost.
CREATE FUNCTION orca._next_attempt(p_run bigint, p_reason text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    r orca.runs;
    v_pool    text;
    v_attempt bigint;
BEGIN
    UPDATE orca.runs SET attempts = attempts + 1 WHERE id = p_run RETURNING * INTO r;
    SELECT pool INTO v_pool FROM orca.pipeline_versions WHERE id = r.version_id;
    INSERT INTO orca.attempts (org_id, run_id, number, version_id, pool)
    VALUES (r.org_id, r.id, r.attempts, r.version_id, v_pool)
    RETURNING id INTO v_attempt;
    INSERT INTO orca.queue (org_id, pool, attempt_id) VALUES (r.org_id, v_pool, v_attempt);
    PERFORM orca._event(r.org_id, 'run.retrying', r.pipeline_id, r.id, v_attempt,
                        jsonb_build_object('attempt', r.attempts, 'after', p_reason,
                                           'failures', r.failures, 'losses', r.losses));
    PERFORM pg_notify('orca_work', v_pool);
END
$$;

-- Locks an attempt's run, then the attempt (the lock order above).
CREATE FUNCTION orca._lock_attempt(p_attempt bigint) RETURNS orca.attempts
LANGUAGE plpgsql AS $$
DECLARE
    a orca.attempts;
BEGIN
    PERFORM 1 FROM orca.runs
    WHERE id = (SELECT run_id FROM orca.attempts WHERE id = p_attempt) FOR UPDATE;
    SELECT * INTO a FROM orca.attempts WHERE id = p_attempt FOR UPDATE;
    RETURN a;
END
$$;

-- Ends an attempt (locked by the caller with _lock_attempt) as succeeded,
-- failed, lost or released, and moves its run on: done, retried, or failed for
-- good.
-- Returns the run's status afterwards.
CREATE FUNCTION orca._attempt_ended(p_attempt bigint, p_outcome text, p_error text)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    a orca.attempts;
    r orca.runs;
    v_lost_max integer;
    v_deadline timestamptz;
    v_beat     timestamptz;
BEGIN
    DELETE FROM orca.leases WHERE attempt_id = p_attempt
    RETURNING deadline, heartbeat_at INTO v_deadline, v_beat;
    UPDATE orca.attempts
    SET status = p_outcome, finished_at = now(), error = p_error,
        deadline = coalesce(v_deadline, deadline), heartbeat_at = coalesce(v_beat, heartbeat_at)
    WHERE id = p_attempt
    RETURNING * INTO a;
    SELECT * INTO r FROM orca.runs WHERE id = a.run_id;
    PERFORM orca._event(a.org_id, 'attempt.' || p_outcome, r.pipeline_id, r.id, a.id,
                        jsonb_strip_nulls(jsonb_build_object('attempt', a.number,
                                                             'runner', a.runner,
                                                             'error', p_error)));
    IF r.status <> 'running' OR r.kind = 'sense' THEN
        -- A sensor's polls come and go; its sense run stays as it is.
        RETURN r.status;
    END IF;
    IF p_outcome = 'released' THEN
        -- Handing work back is not the run's fault: its budgets stay as they are.
        PERFORM orca._next_attempt(r.id, 'released');
        RETURN 'running';
    END IF;
    IF p_outcome = 'succeeded' THEN
        UPDATE orca.runs SET status = 'succeeded', finished_at = now(), error = NULL
        WHERE id = r.id;
        PERFORM orca._event(r.org_id, 'run.succeeded', r.pipeline_id, r.id, a.id,
                            jsonb_build_object('attempts', r.attempts));
        PERFORM orca._slot_freed(r.org_id, r.pipeline_id);
        RETURN 'succeeded';
    END IF;
    IF p_outcome = 'failed' AND r.failures < r.run_retries THEN
        UPDATE orca.runs SET failures = failures + 1 WHERE id = r.id;
        PERFORM orca._next_attempt(r.id, 'failed');
        RETURN 'running';
    END IF;
    v_lost_max := orca._lost_attempts_max();
    IF p_outcome = 'lost' AND r.losses < v_lost_max THEN
        UPDATE orca.runs SET losses = losses + 1 WHERE id = r.id;
        PERFORM orca._next_attempt(r.id, 'lost');
        RETURN 'running';
    END IF;
    UPDATE orca.runs
    SET status = 'failed', finished_at = now(),
        failures = failures + (p_outcome = 'failed')::int,
        losses = losses + (p_outcome = 'lost')::int,
        error = CASE WHEN p_outcome = 'lost'
                     THEN format('attempt %s was lost (%s) and the run had no lost attempts left (orca.lost_attempts_max = %s)',
                                 a.number, p_error, v_lost_max)
                     ELSE p_error END
    WHERE id = r.id;
    PERFORM orca._event(r.org_id, 'run.failed', r.pipeline_id, r.id, a.id,
                        jsonb_build_object('attempts', r.attempts, 'error', p_error));
    PERFORM orca._slot_freed(r.org_id, r.pipeline_id);
    RETURN 'failed';
END
$$;

-- Explains why a lease token was refused, as an error that names it.
CREATE FUNCTION orca._lease_refused(p_org bigint, p_lease uuid) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    a orca.attempts;
BEGIN
    SELECT * INTO a FROM orca.attempts
    WHERE id = orca._lease_attempt(p_lease) AND lease = p_lease AND org_id = p_org;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown lease %', coalesce(p_lease::text, 'NULL')
            USING ERRCODE = 'OR012',
                  HINT = 'use the lease token orca.claim returned, in the org that claimed it';
    END IF;
    IF a.status = 'cancelled' THEN
        RAISE EXCEPTION 'run % was cancelled: stop attempt % (lease %)', a.run_id, a.number, p_lease
            USING ERRCODE = 'OR015';
    END IF;
    RAISE EXCEPTION 'lease % is no longer active: attempt % of run % is %', p_lease, a.number,
                    a.run_id, a.status
        USING ERRCODE = 'OR014',
              HINT = CASE a.status
                         WHEN 'lost' THEN 'its deadline passed without a heartbeat, so the attempt was handed on'
                         ELSE 'the attempt already finished' END;
END
$$;

-- The attempt a live lease of this org holds, unlocked (for reads), or an
-- error that says why the lease is refused.
CREATE FUNCTION orca._live_attempt(p_org bigint, p_lease uuid) RETURNS orca.attempts
LANGUAGE plpgsql AS $$
DECLARE
    a orca.attempts;
BEGIN
    SELECT x.* INTO a FROM orca.leases l JOIN orca.attempts x ON x.id = l.attempt_id
    WHERE l.attempt_id = orca._lease_attempt(p_lease) AND l.lease = p_lease AND l.org_id = p_org;
    IF NOT FOUND THEN
        PERFORM orca._lease_refused(p_org, p_lease);
    END IF;
    RETURN a;
END
$$;

-- The attempt a live lease of this org holds, locked (its run first), or an
-- error that says why the lease is refused. Nothing of another org is locked.
CREATE FUNCTION orca._leased_attempt(p_org bigint, p_lease uuid) RETURNS orca.attempts
LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint := orca._lease_attempt(p_lease);
    a    orca.attempts;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM orca.leases l
                   WHERE l.attempt_id = v_id AND l.lease = p_lease AND l.org_id = p_org) THEN
        PERFORM orca._lease_refused(p_org, p_lease);
    END IF;
    a := orca._lock_attempt(v_id);
    -- Re-checked under the lock: a cancel or a tick may have won.
    IF a.status IS DISTINCT FROM 'leased' THEN
        PERFORM orca._lease_refused(p_org, p_lease);
    END IF;
    RETURN a;
END
$$;

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

-- Queues the next poll of a sensor: a new pending attempt of its sense run.
CREATE FUNCTION orca._queue_sense(p_run bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    r orca.runs;
    v_pool text;
    v_attempt bigint;
BEGIN
    UPDATE orca.runs SET attempts = attempts + 1 WHERE id = p_run RETURNING * INTO r;
    SELECT pool INTO v_pool FROM orca.pipeline_versions
    WHERE id = (SELECT current_version FROM orca.pipelines WHERE id = r.pipeline_id);
    INSERT INTO orca.attempts (org_id, run_id, number, version_id, pool)
    VALUES (r.org_id, r.id, r.attempts,
            (SELECT current_version FROM orca.pipelines WHERE id = r.pipeline_id), v_pool)
    RETURNING id INTO v_attempt;
    INSERT INTO orca.queue (org_id, pool, attempt_id) VALUES (r.org_id, v_pool, v_attempt);
    PERFORM orca._event(r.org_id, 'sense.queued', r.pipeline_id, r.id, v_attempt,
                        jsonb_build_object('attempt', r.attempts));
    PERFORM pg_notify('orca_work', v_pool);
END
$$;

---------------------------------------------------------------------------
-- Keyed pipelines
---------------------------------------------------------------------------

-- Queues a keys task: a run of kind 'keys' whose one attempt runs
-- `<binary> keys --lease`, reads the keys dataset's current snapshot and
-- reports its keys with orca.report_keys, which then acts on the request.
-- A request for every key ('all') or a plain read ('refresh') joins one of the
-- same mode that has not started reading yet. Returns the task's run id.
CREATE FUNCTION orca._keys_task(p_org bigint, p_pipeline bigint, p_mode text, p_trigger text,
                                p_request jsonb DEFAULT '{}')
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_run bigint;
    v orca.pipeline_versions;
BEGIN
    SELECT * INTO v FROM orca.pipeline_versions
    WHERE id = (SELECT current_version FROM orca.pipelines WHERE id = p_pipeline);
    IF p_mode IN ('all', 'refresh') THEN
        SELECT r.id INTO v_run FROM orca.runs r
        WHERE r.pipeline_id = p_pipeline AND r.kind = 'keys' AND r.request->>'mode' = p_mode
          AND r.status IN ('queued', 'running') AND r.version_id = v.id
          AND NOT EXISTS (SELECT 1 FROM orca.attempts a
                          WHERE a.run_id = r.id AND a.status <> 'pending')
        ORDER BY r.id LIMIT 1;
        IF v_run IS NOT NULL THEN
            RETURN v_run;
        END IF;
    END IF;
    INSERT INTO orca.runs (org_id, pipeline_id, version_id, partitions, trigger, kind, request,
                           run_retries)
    VALUES (p_org, p_pipeline, v.id, ARRAY['*'], p_trigger, 'keys',
            jsonb_build_object('mode', p_mode, 'dataset', v.keys_dataset,
                               'column', v.keys_column) || coalesce(p_request, '{}'),
            greatest(v.run_retries, 2))
    RETURNING id INTO v_run;
    PERFORM orca._event(p_org, 'run.queued', p_pipeline, v_run, NULL,
        jsonb_build_object('kind', 'keys', 'mode', p_mode, 'trigger', p_trigger,
                           'dataset', v.keys_dataset, 'by', session_user));
    -- Reading keys takes no run slot: max_runs caps the runs it queues.
    PERFORM orca._start_runs(ARRAY[v_run]);
    RETURN v_run;
END
$$;

-- Refuses a keyed pipeline's names that are not current keys.
CREATE FUNCTION orca._check_keys(p orca.pipelines, p_names text[]) RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_unknown text[];
BEGIN
    IF p.keys_generation = 0 THEN
        RAISE EXCEPTION 'pipeline ''%'' has not read its keys yet, so % cannot be checked',
                        p.name, array_to_string(p_names[1:5], ', ')
            USING ERRCODE = 'OR024',
                  HINT = format('SELECT orca.refresh_keys(%L) reads them; orca.backfill(%L, ''@all'') reads them and runs every key that is not done',
                                p.name, p.name);
    END IF;
    SELECT array_agg(n ORDER BY o) INTO v_unknown
    FROM unnest(p_names) WITH ORDINALITY AS x(n, o)
    WHERE NOT EXISTS (SELECT 1 FROM orca.keys k
                      WHERE k.pipeline_id = p.id AND k.key = x.n
                        AND k.generation = p.keys_generation);
    IF v_unknown IS NOT NULL THEN
        RAISE EXCEPTION '% % not a key of pipeline ''%'' (the keys of its dataset''s snapshot %, read %)',
                        (SELECT string_agg(quote_literal(u), ', ') FROM unnest(v_unknown[1:5]) AS u)
                        || CASE WHEN cardinality(v_unknown) > 5
                                THEN format(' and %s more', cardinality(v_unknown) - 5) ELSE '' END,
                        CASE WHEN cardinality(v_unknown) = 1 THEN 'is' ELSE 'are' END,
                        p.name, coalesce(p.keys_snapshot::text, '(none: the table was empty)'),
                        p.keys_read_at
            USING ERRCODE = 'OR024',
                  HINT = format('orca.key_status(%L) lists the keys; if the dataset changed since, SELECT orca.refresh_keys(%L)',
                                p.name, p.name);
    END IF;
END
$$;

-- The names a keyed pipeline's spec gives, checked; NULL for '@all'.
CREATE FUNCTION orca._key_names(p orca.pipelines, p_spec text) RETURNS text[]
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_known text[];
    s jsonb;
    v_names text[];
BEGIN
    IF p_spec IS NULL THEN
        RAISE EXCEPTION 'malformed partition list: partitions must not be NULL'
            USING ERRCODE = 'OR021';
    END IF;
    SELECT array_agg(k.key) INTO v_known
    FROM unnest(string_to_array(p_spec, ',')) AS x(item)
    JOIN orca.keys k ON k.pipeline_id = p.id AND k.key = btrim(x.item)
                    AND k.generation = p.keys_generation;
    s := orca._unwrap(orca._key_spec(p_spec, coalesce(v_known, '{}')));
    IF s ? 'all' THEN
        RETURN NULL;
    END IF;
    v_names := ARRAY(SELECT jsonb_array_elements_text(s->'names'));
    IF cardinality(v_names) > orca._max_partitions() THEN
        RAISE EXCEPTION '''%'' names % partitions, more than the limit of %',
                        left(p_spec, 60), cardinality(v_names), orca._max_partitions()
            USING ERRCODE = 'OR023', HINT = 'split the request, or raise orca.max_partitions';
    END IF;
    PERFORM orca._check_keys(p, v_names);
    RETURN v_names;
END
$$;

-- The current keys of a keyed pipeline that are not done: a key is done when
-- every mapped step of the current version succeeded for it in a run of a
-- version with the same registry hash.
CREATE FUNCTION orca._keys_not_done(p_pipeline bigint) RETURNS SETOF text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    p orca.pipelines;
    v orca.pipeline_versions;
    v_mapped text[];
BEGIN
    SELECT * INTO p FROM orca.pipelines WHERE id = p_pipeline;
    SELECT * INTO v FROM orca.pipeline_versions WHERE id = p.current_version;
    SELECT array_agg(name) INTO v_mapped FROM orca.steps
    WHERE version_id = v.id AND kind = 'mapped';
    RETURN QUERY
    WITH done AS (
        SELECT ss.partition, count(DISTINCT ss.step) AS n
        FROM orca.runs r
        JOIN orca.pipeline_versions rv ON rv.id = r.version_id AND rv.registry_hash = v.registry_hash
        JOIN orca.step_states ss ON ss.run_id = r.id AND ss.status = 'succeeded'
                                AND ss.step = ANY (coalesce(v_mapped, '{}'))
        WHERE r.pipeline_id = p_pipeline AND r.kind = 'pipeline'
        GROUP BY ss.partition
    )
    SELECT k.key FROM orca.keys k
    LEFT JOIN done d ON d.partition = k.key
    WHERE k.pipeline_id = p_pipeline AND k.generation = p.keys_generation
      AND coalesce(d.n, 0) < coalesce(cardinality(v_mapped), 0)
    ORDER BY k.key;
END
$$;

-- Queues runs of at most keys_per_run keys each over p_keys, in order,
-- leaving out keys that already have a queued or running run. Returns the
-- run ids.
CREATE FUNCTION orca._queue_key_runs(p_org bigint, p_pipeline bigint, p_keys text[],
                                     p_trigger text, p_parent bigint)
RETURNS bigint[]
LANGUAGE plpgsql AS $$
DECLARE
    v orca.pipeline_versions;
    v_ids bigint[];
    v_active text[];
BEGIN
    IF p_keys IS NULL OR cardinality(p_keys) = 0 THEN
        RETURN '{}';
    END IF;
    SELECT * INTO v FROM orca.pipeline_versions
    WHERE id = (SELECT current_version FROM orca.pipelines WHERE id = p_pipeline);
    SELECT array_agg(DISTINCT x) INTO v_active
    FROM orca.runs r, unnest(r.partitions) AS x
    WHERE r.pipeline_id = p_pipeline AND r.kind = 'pipeline'
      AND r.status IN ('queued', 'running') AND x = ANY (p_keys);
    IF v_active IS NOT NULL THEN
        RAISE NOTICE 'skipped % key(s) that already have a queued or running run: %',
            cardinality(v_active), array_to_string(v_active[1:10], ', ')
            || CASE WHEN cardinality(v_active) > 10 THEN ', ...' ELSE '' END;
    END IF;
    WITH todo AS (
        SELECT key, ord FROM unnest(p_keys) WITH ORDINALITY AS x(key, ord)
        WHERE NOT (key = ANY (coalesce(v_active, '{}')))
    ), grouped AS (
        SELECT (row_number() OVER (ORDER BY ord) - 1) / v.keys_per_run AS grp, key, ord FROM todo
    ), ins AS (
        INSERT INTO orca.runs (org_id, pipeline_id, version_id, partitions, trigger, run_retries,
                               parent_run)
        SELECT p_org, p_pipeline, v.id, array_agg(key ORDER BY ord), p_trigger, v.run_retries,
               p_parent
        FROM grouped GROUP BY grp ORDER BY grp
        RETURNING id
    )
    SELECT array_agg(id ORDER BY id) INTO v_ids FROM ins;
    PERFORM orca._runs_created(p_org, p_pipeline, v_ids);
    RETURN coalesce(v_ids, '{}');
END
$$;
