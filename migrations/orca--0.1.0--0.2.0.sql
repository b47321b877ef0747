-- Upgrades the orca extension from 0.1.0 to 0.2.0: ALTER EXTENSION orca UPDATE.
--
-- Every schema change of 0.2.0 is here as well as in sql/; the release test
-- (tests/tests/release.rs) installs 0.1.0, runs this script and compares the
-- catalog with a fresh 0.2.0 install. Run it after the 0.2.0 library is
-- installed and the server restarted (docs/operations.md, "Upgrading").

\echo Use "ALTER EXTENSION orca UPDATE TO '0.2.0'" to load this file. \quit

---------------------------------------------------------------------------
-- Settings read by the tick: the bounds its LIMITs had built in.
---------------------------------------------------------------------------

CREATE  FUNCTION "_max_lost_per_tick"() RETURNS INT /* i32 */
STRICT STABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'max_lost_per_tick_wrapper';

CREATE  FUNCTION "_max_sensor_commits_per_tick"() RETURNS INT /* i32 */
STRICT STABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'max_sensor_commits_per_tick_wrapper';

---------------------------------------------------------------------------
-- A tick touches only what is due: each schedule's next fire is stored and
-- indexed; sensors are found by their commit cursor and last poll.
---------------------------------------------------------------------------

CREATE FUNCTION orca._next_fire(p_cron text, p_tz text, p_after timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_after IS NULL THEN '-infinity'::timestamptz
                ELSE (orca._cron_next(p_cron, p_tz, p_after, 1))[1] END
$$;

ALTER TABLE orca.schedules ADD COLUMN next_fire_at timestamptz DEFAULT '-infinity';
UPDATE orca.schedules SET next_fire_at = orca._next_fire(cron, tz, fired_until);
CREATE INDEX schedules_due ON orca.schedules (next_fire_at);
COMMENT ON TABLE orca.schedules IS
'Cron schedules of pipelines; fired_until is how far orca.tick has turned fires into runs, '
'next_fire_at the first fire after it.';
CREATE INDEX commits_org ON orca.commits (org_id, id);
CREATE INDEX sensors_cursor ON orca.sensors (org_id, commit_cursor);
CREATE INDEX sensors_sense_due ON orca.sensors (last_sense_at);

CREATE FUNCTION orca._tick_fires(p_orgs bigint[], p_now timestamptz) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_max     integer := orca._max_fires_per_tick();
    s         record;
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
    v_got     integer;
    v_capped  bigint[] := '{}';
BEGIN
    -- The due schedules, a batch of 100 at a time in next-fire order: ORDER BY
    -- and LIMIT keep the read on schedules_due whatever the statistics say of
    -- next_fire_at (they go stale as time passes the values they saw, and
    -- then a plain filter reads every schedule), and each one's pipeline and
    -- version are found by primary key. A schedule whose catch-up was capped
    -- is still due after its turn; v_capped keeps it to one turn a tick.
    LOOP
    v_got := 0;
    FOR s IN
        SELECT sc.*, x.paused, x.version_id, x.partition_kind, x.partition_start, x.run_retries
        FROM orca.schedules sc
        CROSS JOIN LATERAL (
            SELECT p.paused, v.id AS version_id, v.partition_kind, v.partition_start,
                   v.run_retries
            FROM orca.pipelines p JOIN orca.pipeline_versions v ON v.id = p.current_version
            WHERE p.id = sc.pipeline_id
        ) x
        WHERE sc.next_fire_at <= p_now AND sc.org_id = ANY (p_orgs)
          AND NOT (sc.pipeline_id = ANY (v_capped))
        ORDER BY sc.next_fire_at
        LIMIT 100
        FOR UPDATE OF sc SKIP LOCKED
    LOOP
        v_got := v_got + 1;
        v_from := coalesce(s.fired_until, least(s.registered_at, p_now));
        IF p_now <= v_from THEN
            -- The schedule's first tick: its clock starts here.
            UPDATE orca.schedules
            SET fired_until = v_from, next_fire_at = orca._next_fire(s.cron, s.tz, v_from)
            WHERE pipeline_id = s.pipeline_id;
            CONTINUE;
        END IF;
        v_until := p_now;
        v_fires := orca._cron_fires(s.cron, s.tz, v_from, p_now, v_max + 1);
        IF NOT s.catchup THEN
            -- Only the latest of the fires missed while nothing ticked.
            v_missed := least(cardinality(v_fires), v_max) - 1;
            v_fires := coalesce(ARRAY[orca._cron_last(s.cron, s.tz, v_from, p_now)], '{}');
            v_fires := array_remove(v_fires, NULL);
            IF v_missed > 0 THEN
                n_missed := n_missed + v_missed;
                PERFORM orca._event(s.org_id, 'schedule.missed', s.pipeline_id, NULL, NULL,
                    jsonb_build_object('missed', v_missed, 'capped_at', v_max, 'from', v_from,
                                       'until', p_now, 'kept', v_fires[1]));
            END IF;
        ELSIF cardinality(v_fires) > v_max THEN
            -- More than one tick may make: the rest waits for the next tick.
            v_fires := v_fires[1:v_max];
            v_until := v_fires[v_max];
            v_capped := v_capped || s.pipeline_id;
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
            last_fire_at = coalesce(v_fires[cardinality(v_fires)], last_fire_at),
            next_fire_at = orca._next_fire(s.cron, s.tz, v_until)
        WHERE pipeline_id = s.pipeline_id;
        n_runs := n_runs + cardinality(v_ids);
        PERFORM orca._runs_created(s.org_id, s.pipeline_id, v_ids);
    END LOOP;
    EXIT WHEN v_got < 100;
    END LOOP;
    RETURN jsonb_build_object('fires', n_fires, 'runs_created', n_runs,
                              'fires_skipped', n_skipped, 'fires_missed', n_missed);
END
$$;

CREATE FUNCTION orca._tick_leases(p_orgs bigint[], p_now timestamptz) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    a      record;
    n_lost integer := 0;
BEGIN
    FOR a IN
        SELECT l.attempt_id AS id, l.deadline, l.runner FROM orca.leases l
        WHERE l.deadline < p_now AND l.org_id = ANY (p_orgs)
        ORDER BY l.attempt_id
        LIMIT orca._max_lost_per_tick()
    LOOP
        DECLARE
            l orca.attempts := orca._lock_attempt(a.id);
        BEGIN
            -- Re-checked under the lock: a heartbeat or finish may have won.
            IF l.status = 'leased' AND EXISTS (SELECT 1 FROM orca.leases x
                                               WHERE x.attempt_id = a.id AND x.deadline < p_now) THEN
                PERFORM orca._attempt_ended(l.id, 'lost',
                    format('lease expired at %s without a heartbeat from runner %s',
                           a.deadline, a.runner));
                n_lost := n_lost + 1;
            END IF;
        END;
    END LOOP;
    RETURN jsonb_build_object('attempts_lost', n_lost);
END
$$;

CREATE FUNCTION orca._tick_sensors(p_orgs bigint[], p_now timestamptz) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_poll_before timestamptz := p_now - make_interval(secs => orca._sense_seconds());
    v_commits_max integer := orca._max_sensor_commits_per_tick();
    v_due      bigint[];
    sn         record;
    c          record;
    v_cursor   bigint;
    v_sense_run bigint;
    n_sensed   integer := 0;
    n_polls    integer := 0;
BEGIN
    SELECT array_agg(DISTINCT d.pipeline_id) INTO v_due
    FROM (
        SELECT x.pipeline_id
        FROM unnest(p_orgs) AS o(id)
        CROSS JOIN LATERAL (SELECT max(cm.id) AS newest FROM orca.commits cm
                            WHERE cm.org_id = o.id) nc
        JOIN orca.sensors x ON x.org_id = o.id AND x.commit_cursor < nc.newest
        UNION ALL
        SELECT x.pipeline_id FROM orca.sensors x
        WHERE (x.last_sense_at IS NULL OR x.last_sense_at <= v_poll_before)
          AND x.org_id = ANY (p_orgs)
    ) d;
    IF v_due IS NULL THEN
        RETURN jsonb_build_object('sensor_runs', 0, 'sense_polls', 0);
    END IF;
    FOR sn IN
        SELECT x.*, v.id AS version_id, v.keys_dataset
        FROM orca.sensors x
        JOIN orca.pipelines p ON p.id = x.pipeline_id
        JOIN orca.pipeline_versions v ON v.id = p.current_version
        WHERE x.pipeline_id = ANY (v_due) AND NOT p.paused AND v.sensor
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
            LIMIT v_commits_max
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
        IF v_cursor <> sn.commit_cursor THEN
            UPDATE orca.sensors SET commit_cursor = v_cursor WHERE pipeline_id = sn.pipeline_id;
        END IF;
        -- The next poll, when one is due and none is waiting or running.
        IF sn.last_sense_at IS NULL OR sn.last_sense_at <= v_poll_before THEN
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
                UPDATE orca.sensors SET last_sense_at = p_now WHERE pipeline_id = sn.pipeline_id;
                n_polls := n_polls + 1;
            END IF;
        END IF;
    END LOOP;
    RETURN jsonb_build_object('sensor_runs', n_sensed, 'sense_polls', n_polls);
END
$$;

CREATE FUNCTION orca._tick_queued(p_orgs bigint[]) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    q         record;
    n_started integer := 0;
BEGIN
    FOR q IN
        SELECT DISTINCT r.org_id, r.pipeline_id FROM orca.runs r
        WHERE r.status = 'queued' AND r.org_id = ANY (p_orgs)
    LOOP
        n_started := n_started + orca._start_queued(q.org_id, q.pipeline_id);
    END LOOP;
    RETURN jsonb_build_object('runs_started', n_started);
END
$$;

CREATE OR REPLACE FUNCTION orca.tick(now timestamptz DEFAULT now()) RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now  timestamptz := tick.now;
    v_orgs bigint[] := orca._tick_orgs();
BEGIN
    IF v_now IS NULL OR NOT isfinite(v_now) THEN
        RAISE EXCEPTION 'now must be a finite timestamp, got %', coalesce(v_now::text, 'NULL')
            USING ERRCODE = 'OR050';
    END IF;
    RETURN jsonb_build_object('now', v_now)
        || orca._tick_fires(v_orgs, v_now)
        || orca._tick_leases(v_orgs, v_now)
        || orca._tick_sensors(v_orgs, v_now)
        || orca._tick_queued(v_orgs);
END
$$;
COMMENT ON FUNCTION orca.tick(timestamptz) IS
'Does all periodic work at instant now: due cron fires become runs (one per fire, whatever '
'the number of ticks), leases past their deadline are lost and their runs retried, queued '
'runs start within max_runs, sensors start runs for new snapshots and queue their polls. '
'Idempotent for the same now. The background worker calls it '
'every orca.tick_ms; without it, call it from cron, a runner or a test. An admin who set no '
'orca.org ticks every org; anyone else ticks the session''s org. Returns counts.';

CREATE OR REPLACE FUNCTION orca.register(manifest jsonb) RETURNS bigint
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

CREATE OR REPLACE FUNCTION orca._sync_pipeline(p_org bigint, p_name text, p_def jsonb, p_schedule text,
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
        ON CONFLICT (pipeline_id) DO UPDATE
        SET cron = excluded.cron,
            next_fire_at = orca._next_fire(excluded.cron, schedules.tz, schedules.fired_until);
    ELSE
        DELETE FROM orca.schedules WHERE pipeline_id = v_pid;
    END IF;
    RETURN v_pid;
END
$$;

---------------------------------------------------------------------------
-- Attempts are made in one place (_enqueue_attempts); a run of the org is
-- locked or refused in one place (_lock_run).
---------------------------------------------------------------------------

CREATE FUNCTION orca._enqueue_attempts(p_runs bigint[], p_version bigint DEFAULT NULL)
RETURNS SETOF orca.attempts
LANGUAGE plpgsql AS $$
DECLARE
    v_made orca.attempts[];
BEGIN
    WITH att AS (
        INSERT INTO orca.attempts (org_id, run_id, number, version_id, pool)
        SELECT r.org_id, r.id, r.attempts, v.id, v.pool
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

CREATE OR REPLACE FUNCTION orca._start_runs(p_runs bigint[]) RETURNS integer
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

CREATE OR REPLACE FUNCTION orca._next_attempt(p_run bigint, p_reason text) RETURNS void
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

CREATE OR REPLACE FUNCTION orca._queue_sense(p_run bigint) RETURNS void
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

CREATE OR REPLACE FUNCTION orca.cancel(run bigint) RETURNS void
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

CREATE OR REPLACE FUNCTION orca.retry(run bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_org bigint := orca.current_org_id();
    r orca.runs;
    v orca.pipeline_versions;
BEGIN
    r := orca._lock_run(v_org, retry.run);
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
-- A commit point asked again (its answer lost in a server restart) succeeds
-- and changes nothing.
---------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION orca.advance_head(sync text, generation integer, epoch bigint, record text)
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
    IF advance_head.epoch = s.head_epoch AND advance_head.record = s.head_record THEN
        -- This very commit again: its answer was lost on the way (a server
        -- restart), and the attempt asks once more. It is in already.
        RETURN;
    END IF;
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
'no longer the sync''s gets OR070 (fenced) and changes nothing; an epoch out of order OR071. '
'The same commit again (same generation, epoch and record: a retry whose first answer was '
'lost) succeeds and changes nothing.';

CREATE OR REPLACE FUNCTION orca.rewind_head(sync text, generation integer, epoch bigint, record text)
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
    -- (The CASE in parentheses: a bare THEN would end the IF's condition.)
    IF rewind_head.epoch = s.head_epoch
       AND s.head_record IS NOT DISTINCT FROM
           (CASE WHEN rewind_head.epoch = 0 THEN NULL ELSE rewind_head.record END) THEN
        -- This very rewind again, after its answer was lost: done already.
        RETURN;
    END IF;
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
'(OR070); any other epoch is OR071, but the same rewind again succeeds and changes nothing.';

---------------------------------------------------------------------------
-- One rule for keys, in Rust (orca_core::keyed::valid_key), where SQL had a
-- regex of its own.
---------------------------------------------------------------------------

CREATE  FUNCTION "_valid_key"(
	"key" TEXT /* & str */
) RETURNS bool /* bool */
IMMUTABLE STRICT PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'valid_key_wrapper';
ALTER TABLE orca.keys DROP CONSTRAINT keys_key_check;
ALTER TABLE orca.keys ADD CONSTRAINT keys_key_check CHECK (orca._valid_key(key));

CREATE OR REPLACE FUNCTION orca.report_keys(lease uuid, snapshot bigint, snapshot_ms bigint, keys text[])
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
    WHERE k IS NULL OR NOT orca._valid_key(k) LIMIT 1;
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

---------------------------------------------------------------------------
-- The Iceberg catalog's tables are the extension's (sql/catalog.sql): made
-- here, or adopted with their rows where clients made them under 0.1.0.
---------------------------------------------------------------------------

DO $catalog$
BEGIN
    IF to_regclass('public.iceberg_tables') IS NULL THEN
        CREATE TABLE public.iceberg_tables (
            catalog_name               VARCHAR(255) NOT NULL,
            table_namespace            VARCHAR(255) NOT NULL,
            table_name                 VARCHAR(255) NOT NULL,
            metadata_location          VARCHAR(1000),
            previous_metadata_location VARCHAR(1000),
            iceberg_type               VARCHAR(5),
            PRIMARY KEY (catalog_name, table_namespace, table_name)
        );
    ELSE
        ALTER EXTENSION orca ADD TABLE public.iceberg_tables;
        ALTER TABLE public.iceberg_tables ADD COLUMN IF NOT EXISTS iceberg_type VARCHAR(5);
    END IF;
    IF to_regclass('public.iceberg_namespace_properties') IS NULL THEN
        CREATE TABLE public.iceberg_namespace_properties (
            catalog_name   VARCHAR(255) NOT NULL,
            namespace      VARCHAR(255) NOT NULL,
            property_key   VARCHAR(255),
            property_value VARCHAR(1000),
            PRIMARY KEY (catalog_name, namespace, property_key)
        );
    ELSE
        ALTER EXTENSION orca ADD TABLE public.iceberg_namespace_properties;
    END IF;
END
$catalog$;
COMMENT ON TABLE public.iceberg_tables IS
'The Iceberg SQL catalog''s tables: one row per table of each org (catalog_name = the org), '
'pointing at its current metadata file. Made by the orca extension.';
COMMENT ON TABLE public.iceberg_namespace_properties IS
'The Iceberg SQL catalog''s namespaces and their properties, per org (catalog_name). Made by '
'the orca extension.';

-- pg_dump keeps the catalog's rows: they are the tables' current versions.
SELECT pg_catalog.pg_extension_config_dump('public.iceberg_tables', '');
SELECT pg_catalog.pg_extension_config_dump('public.iceberg_namespace_properties', '');

REVOKE ALL ON public.iceberg_tables, public.iceberg_namespace_properties FROM PUBLIC;
GRANT SELECT ON public.iceberg_tables, public.iceberg_namespace_properties TO orca_viewer, orca_runner;
GRANT INSERT, UPDATE, DELETE ON public.iceberg_tables, public.iceberg_namespace_properties
    TO orca_runner;

---------------------------------------------------------------------------
-- A runner claims only what it can run: each queue row says what it is, and
-- orca.claim takes the commands the runner runs.
---------------------------------------------------------------------------

CREATE FUNCTION orca._command(p_kind text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE p_kind WHEN 'sense' THEN 'sense' WHEN 'keys' THEN 'keys'
                       WHEN 'sync' THEN 'sync' ELSE 'attempt' END
$$;
ALTER TABLE orca.queue ADD COLUMN command text NOT NULL DEFAULT 'attempt'
    CHECK (command IN ('attempt', 'sense', 'keys', 'sync'));
UPDATE orca.queue q SET command = orca._command(r.kind)
FROM orca.attempts a JOIN orca.runs r ON r.id = a.run_id
WHERE a.id = q.attempt_id;
DROP FUNCTION orca.claim(text, text, integer);
CREATE FUNCTION orca.claim(runner text, pool text DEFAULT 'default', max integer DEFAULT 1,
                           commands text[] DEFAULT NULL)
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
    IF claim.commands IS NOT NULL AND EXISTS (
           SELECT 1 FROM unnest(claim.commands) AS c
           WHERE c IS NULL OR c NOT IN ('attempt', 'sense', 'keys', 'sync')) THEN
        RAISE EXCEPTION 'commands must list attempt, sense, keys or sync, got %',
            (SELECT quote_nullable(c) FROM unnest(claim.commands) AS c
             WHERE c IS NULL OR c NOT IN ('attempt', 'sense', 'keys', 'sync') LIMIT 1)
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
            AND (claim.commands IS NULL OR q.command = ANY (claim.commands))
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
           orca._command(i.run_kind)
    FROM info i
    ORDER BY i.id;
END
$$;
COMMENT ON FUNCTION orca.claim(text, text, integer, text[]) IS
'Leases up to max pending attempts of a pool to a runner, oldest first, with FOR UPDATE SKIP '
'LOCKED so that concurrent runners never get the same attempt. Each lease lasts '
'orca.lease_seconds; keep it with orca.heartbeat and end it with orca.finish. commands: what '
'the runner can run (attempt, sense, keys, sync; NULL: all), so that a runner not set up for '
'syncs leaves them to one that is. '
'Example: SELECT * FROM orca.claim(''runner-1'', max => 4);';
REVOKE ALL ON FUNCTION orca.claim(text, text, integer, text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION orca.claim(text, text, integer, text[]) TO orca_runner;

---------------------------------------------------------------------------
-- Internal functions are granted to nobody.
---------------------------------------------------------------------------

REVOKE ALL ON FUNCTION
    orca._max_lost_per_tick(),
    orca._max_sensor_commits_per_tick(),
    orca._next_fire(text, text, timestamptz),
    orca._tick_fires(bigint[], timestamptz),
    orca._tick_leases(bigint[], timestamptz),
    orca._tick_sensors(bigint[], timestamptz),
    orca._tick_queued(bigint[]),
    orca._enqueue_attempts(bigint[], bigint),
    orca._lock_run(bigint, bigint),
    orca._valid_key(text),
    orca._command(text)
FROM PUBLIC;
