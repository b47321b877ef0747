-- Upgrades the orca extension from 0.1.0 to 0.2.0: ALTER EXTENSION orca UPDATE.
--
-- Every schema change of 0.2.0 is here as well as in sql/; the release test
-- (tests/tests/release.rs) installs 0.1.0, runs this script and compares the
-- catalog with a fresh 0.2.0 install. Run it after the 0.2.0 library is
-- installed and the server restarted (docs/operations.md, "Upgrading").

\echo Use "ALTER EXTENSION orca UPDATE TO '0.2.0'" to load this file. \quit

-- Every table is locked before anything changes: the script alters tables it
-- first only reads or indexes (orca.runs, orca.pipelines...), and a lock
-- raised mid-way while a runner's transaction holds the same table waiting
-- for more is a deadlock (seen with runners in flight). All are taken at
-- once or none (NOWAIT, the failed try releasing what it took), so the
-- upgrade never waits while holding a table: it tries again until the
-- transactions in flight let it, for up to a minute (then 55P03: run it again).
DO $lock$
DECLARE
    stmt text := (
        SELECT 'LOCK TABLE ' || string_agg(c.oid::regclass::text, ', ' ORDER BY c.relname)
               || ' IN ACCESS EXCLUSIVE MODE NOWAIT'
        FROM pg_catalog.pg_class c
        WHERE c.relkind IN ('r', 'p')
          AND (c.relnamespace = 'orca'::regnamespace
               OR c.oid IN (to_regclass('public.iceberg_tables'),
                            to_regclass('public.iceberg_namespace_properties'))));
    started timestamptz := clock_timestamp();
BEGIN
    LOOP
        BEGIN
            EXECUTE stmt;
            RETURN;
        EXCEPTION WHEN lock_not_available THEN
            IF clock_timestamp() - started > interval '1 minute' THEN
                RAISE;
            END IF;
        END;
        PERFORM pg_sleep(0.02);
    END LOOP;
END
$lock$;

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
                PERFORM orca._count(l.org_id, 'leases_lapsed');
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
                   r.pipeline_id, r.kind
            FROM orca.commits cm JOIN orca.runs r ON r.id = cm.run_id
            WHERE cm.org_id = sn.org_id AND cm.id > sn.commit_cursor
            ORDER BY cm.id
            LIMIT v_commits_max
        LOOP
            -- A commit of a run still going is seen once the run has succeeded.
            EXIT WHEN c.status IN ('queued', 'running');
            v_cursor := c.id;
            CONTINUE WHEN c.status <> 'succeeded' OR c.pipeline_id = sn.pipeline_id;
            -- A compaction by table maintenance holds the same rows: nothing new.
            CONTINUE WHEN c.kind = 'maintain';
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
    -- Time is injected by the installation's superuser only (tests,
    -- replays): anyone else's tick acts at the transaction's clock, so nobody
    -- can fire schedules early or expire other runners' leases by naming a
    -- later instant, and no org's admin (an API key) moves any org's time.
    IF v_now <> pg_catalog.now() AND NOT orca._is_superuser() THEN
        RAISE EXCEPTION 'only the installation''s superuser moves the clock: orca.tick(now => %) is not the transaction''s time %',
                        v_now, pg_catalog.now()
            USING ERRCODE = 'OR086',
                  HINT = 'call orca.tick() without now';
    END IF;
    RETURN jsonb_build_object('now', v_now)
        || orca._tick_fires(v_orgs, v_now)
        || orca._tick_leases(v_orgs, v_now)
        || orca._tick_sensors(v_orgs, v_now)
        || orca._tick_continuous(v_orgs, v_now)
        || orca._tick_maintenance(v_orgs, v_now)
        || orca._tick_queued(v_orgs)
        || orca._tick_prune(v_orgs, v_now);
END
$$;
COMMENT ON FUNCTION orca.tick(timestamptz) IS
'Does all periodic work at instant now: due cron fires become runs (one per fire, whatever '
'the number of ticks), leases past their deadline are lost and their runs retried, queued '
'runs start within max_runs, sensors start runs for new snapshots and queue their polls, '
'continuous syncs whose run ended get a new one after a backoff (orca._tick_continuous), due '
'table maintenance schedules queue their runs (orca.schedule_maintenance), and '
'history older than the orca.retain_* settings is pruned in batches (orca.retention()). '
'Idempotent for the same now. The background worker calls it '
'every orca.tick_ms; without it, call it from cron, a runner or a test. An admin who set no '
'orca.org ticks every org; anyone else ticks the session''s org (a runner token''s, for a '
'runner; an API key''s, whatever its role). Only the installation''s superuser may pass a now '
'other than the transaction''s time (OR086). Returns counts.';

CREATE OR REPLACE FUNCTION orca.register(manifest jsonb) RETURNS bigint
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

DROP FUNCTION orca.advance_head(text, integer, bigint, text);
CREATE FUNCTION orca.advance_head(sync text, generation integer, epoch bigint, record text,
                                  lease uuid DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('advance_head', 'sync', octet_length(advance_head.sync), 1024)
                         AND orca._bound('advance_head', 'record', octet_length(advance_head.record), 4096);
    v_org bigint := (orca._sync_caller(advance_head.sync, advance_head.lease, 'moving HEAD of')).org_id;
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
    PERFORM orca._check_record(s, advance_head.record);
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
COMMENT ON FUNCTION orca.advance_head(text, integer, bigint, text, uuid) IS
'The commit point of an epoch: moves the sync''s HEAD to the checkpoint record of epoch '
'(HEAD epoch + 1), as a compare-and-swap under the row lock. An attempt whose generation is '
'no longer the sync''s gets OR070 (fenced) and changes nothing; an epoch out of order OR071. '
'The same commit again (same generation, epoch and record: a retry whose first answer was '
'lost) succeeds and changes nothing. lease: the live lease of the attempt (required except for '
'admins: OR084); record must be an object <org>/<sync>/_checkpoints/<name> (OR085).';

DROP FUNCTION orca.rewind_head(text, integer, bigint, text);
CREATE FUNCTION orca.rewind_head(sync text, generation integer, epoch bigint, record text,
                                  lease uuid DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('rewind_head', 'sync', octet_length(rewind_head.sync), 1024)
                         AND orca._bound('rewind_head', 'record', octet_length(rewind_head.record), 4096);
    v_org bigint := (orca._sync_caller(rewind_head.sync, rewind_head.lease, 'rewinding HEAD of')).org_id;
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
    PERFORM orca._check_record(s, rewind_head.record);
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
COMMENT ON FUNCTION orca.rewind_head(text, integer, bigint, text, uuid) IS
'Recovery''s way back when HEAD''s epoch is lost (nothing of it is visible and its staged files '
'are gone): moves HEAD back to the record of the epoch before (HEAD epoch - 1; NULL record for '
'epoch 0), so the attempt reads that epoch again from there. Fenced like orca.advance_head '
'(OR070); any other epoch is OR071, but the same rewind again succeeds and changes nothing. '
'lease and record as for orca.advance_head (OR084, OR085).';

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
    v_bounded boolean := orca._bound('report_keys', 'keys', octet_length(array_to_string(report_keys.keys, '', '')) + cardinality(report_keys.keys), 16777216);
    v_org bigint := orca._lease_org(report_keys.lease);
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
-- here, with the rows of the tables clients made under 0.1.0.
---------------------------------------------------------------------------

DO $catalog$
DECLARE
    t        text;
    v_tables jsonb;
    v_ns     jsonb;
BEGIN
    -- A database whose clients made the catalog's tables before (Orca 0.1.0
    -- did, and PyIceberg may) keeps their rows, copied into tables the
    -- extension makes. The client-made tables are not adopted as they are:
    -- what their maker left on them (triggers, rules, policies, defaults,
    -- grants, ownership) would run inside the catalog's functions as the
    -- extension's owner. Each must be a plain table of the layout.
    FOREACH t IN ARRAY ARRAY['iceberg_tables', 'iceberg_namespace_properties'] LOOP
        IF (SELECT c.relkind FROM pg_catalog.pg_class c
            WHERE c.oid = to_regclass('public.' || t)) <> 'r' THEN
            RAISE EXCEPTION 'public.% is not a table, so it is not an Iceberg SQL catalog''s', t
                USING HINT = 'move it out of schema public and create or update the extension again';
        END IF;
    END LOOP;
    IF to_regclass('public.iceberg_tables') IS NOT NULL THEN
        -- PyIceberg's layout has no iceberg_type (NULL: a table, to every
        -- client).
        EXECUTE 'SELECT coalesce(jsonb_agg(jsonb_build_array(catalog_name::text, '
                'table_namespace::text, table_name::text, metadata_location::text, '
                'previous_metadata_location::text, '
                || CASE WHEN EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a
                                     WHERE a.attrelid = 'public.iceberg_tables'::regclass
                                       AND a.attname = 'iceberg_type' AND NOT a.attisdropped)
                        THEN 'iceberg_type::text' ELSE 'NULL::text' END
                || ')), ''[]'') FROM public.iceberg_tables'
            INTO v_tables;
        DROP TABLE public.iceberg_tables;
    END IF;
    IF to_regclass('public.iceberg_namespace_properties') IS NOT NULL THEN
        SELECT coalesce(jsonb_agg(jsonb_build_array(catalog_name::text, namespace::text,
                                                    property_key::text, property_value::text)), '[]')
        INTO v_ns FROM public.iceberg_namespace_properties;
        DROP TABLE public.iceberg_namespace_properties;
    END IF;
    CREATE TABLE public.iceberg_tables (
        catalog_name               VARCHAR(255) NOT NULL,
        table_namespace            VARCHAR(255) NOT NULL,
        table_name                 VARCHAR(255) NOT NULL,
        metadata_location          VARCHAR(1000),
        previous_metadata_location VARCHAR(1000),
        iceberg_type               VARCHAR(5),
        PRIMARY KEY (catalog_name, table_namespace, table_name)
    );
    CREATE TABLE public.iceberg_namespace_properties (
        catalog_name   VARCHAR(255) NOT NULL,
        namespace      VARCHAR(255) NOT NULL,
        property_key   VARCHAR(255),
        property_value VARCHAR(1000),
        PRIMARY KEY (catalog_name, namespace, property_key)
    );
    INSERT INTO public.iceberg_tables
    SELECT r->>0, r->>1, r->>2, r->>3, r->>4, r->>5 FROM jsonb_array_elements(v_tables) r;
    INSERT INTO public.iceberg_namespace_properties
    SELECT r->>0, r->>1, r->>2, r->>3 FROM jsonb_array_elements(v_ns) r;
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
                       WHEN 'sync' THEN 'sync' WHEN 'discover' THEN 'discover'
                       WHEN 'maintain' THEN 'maintain' ELSE 'attempt' END
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
    v_bounded boolean := orca._bound('claim', 'runner', octet_length(claim.runner), 1024)
                         AND orca._bound('claim', 'pool', octet_length(claim.pool), 1024)
                         AND orca._bound('claim', 'commands', octet_length(array_to_string(claim.commands, '', '')) + cardinality(claim.commands), 1024);
    t     orca.runner_tokens := orca._runner_session();
    v_org bigint := t.org_id;
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
    PERFORM orca._runner_pool(t, claim.pool);
    IF claim.max IS NULL OR claim.max NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'max must be from 1 to 1000, got %', coalesce(claim.max::text, 'NULL')
            USING ERRCODE = 'OR050';
    END IF;
    IF claim.commands IS NOT NULL AND EXISTS (
           SELECT 1 FROM unnest(claim.commands) AS c
           WHERE c IS NULL OR c NOT IN ('attempt', 'sense', 'keys', 'sync', 'discover', 'maintain')) THEN
        RAISE EXCEPTION 'commands must list attempt, sense, keys, sync, discover or maintain, got %',
            (SELECT quote_nullable(c) FROM unnest(claim.commands) AS c
             WHERE c IS NULL OR c NOT IN ('attempt', 'sense', 'keys', 'sync', 'discover', 'maintain')
             LIMIT 1)
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
        INSERT INTO orca.leases (org_id, attempt_id, lease, runner, deadline, token_id)
        SELECT v_org, l.id, l.lease, claim.runner, l.deadline, t.id FROM leased l
    ), info AS (
        -- LATERAL keeps these lookups on primary keys whatever the planner
        -- guesses about how many rows the UPDATE returns.
        SELECT l.*, x.*
        FROM leased l
        CROSS JOIN LATERAL (
            SELECT r.pipeline_id, p.name AS pipeline_name, r.partitions, v.binary_path,
                   v.registry_hash, r.kind AS run_kind, v.binary_sha256
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
           orca._command(i.run_kind),
           CASE WHEN i.run_kind IN ('sync', 'discover', 'maintain') THEN NULL ELSE i.binary_sha256 END
    FROM info i
    ORDER BY i.id;
END
$$;
COMMENT ON FUNCTION orca.claim(text, text, integer, text[]) IS
'Leases up to max pending attempts of a pool to a runner, oldest first, with FOR UPDATE SKIP '
'LOCKED so that concurrent runners never get the same attempt. Each lease lasts '
'orca.lease_seconds; keep it with orca.heartbeat and end it with orca.finish. commands: what '
'the runner can run (attempt, sense, keys, sync, discover, maintain; NULL: all), so that a runner '
'not set up for '
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

---------------------------------------------------------------------------
-- The trust boundary (sql/security.sql): runner tokens bind a runner to an
-- org and pool; a lease token is its attempt's capability (orca_attempt);
-- sync HEAD calls need the sync's lease and name records under its prefix;
-- only admins move the clock; versions pin their binary's sha256.
---------------------------------------------------------------------------

DO $roles$
BEGIN
    -- A database installing at the same moment may make it first: the role
    -- then exists, which is what this wanted (schema.sql says more).
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'orca_attempt') THEN
        BEGIN
            CREATE ROLE orca_attempt NOLOGIN;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;
        END;
    END IF;
    IF NOT pg_catalog.pg_has_role('orca_runner', 'orca_attempt', 'MEMBER') THEN
        BEGIN
            GRANT orca_attempt TO orca_runner;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;
        END;
    END IF;
END
$roles$;

ALTER TABLE orca.leases ADD COLUMN token_id bigint;
ALTER TABLE orca.pipeline_versions ADD COLUMN binary_sha256 text
    CHECK (binary_sha256 ~ '^[0-9a-f]{64}$');
ALTER TYPE orca.lease ADD ATTRIBUTE binary_sha256 text;
-- A version registered under 0.1.0 by a newer orca register carries the hash
-- in its manifest already: it stays pinned.
UPDATE orca.pipeline_versions SET binary_sha256 = manifest->>'binary_sha256'
WHERE manifest->>'binary_sha256' ~ '^[0-9a-f]{64}$';

-- Runner tokens: 32 random bytes shown once, stored as their sha256. A
-- rotation keeps the old secret working until previous_until, so runners can
-- be given the new one without a gap.
CREATE TABLE orca.runner_tokens (
    org_id         bigint NOT NULL REFERENCES orca.orgs (id),
    id             bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    name           text NOT NULL,
    pool           text NOT NULL,
    hash           bytea NOT NULL UNIQUE,
    previous_hash  bytea UNIQUE,
    previous_until timestamptz,
    created_at     timestamptz NOT NULL DEFAULT now(),
    created_by     name NOT NULL DEFAULT session_user,
    rotated_at     timestamptz,
    revoked_at     timestamptz,
    UNIQUE (org_id, name)
);
COMMENT ON TABLE orca.runner_tokens IS
'Runner tokens (orca.create_runner_token): each binds a runner to one org and pool. Only '
'their hashes are stored, and viewers cannot read those.';
ALTER TABLE orca.runner_tokens ENABLE ROW LEVEL SECURITY;
CREATE POLICY org_scope ON orca.runner_tokens USING (org_id = (SELECT orca.current_org_id()));
SELECT pg_catalog.pg_extension_config_dump('orca.runner_tokens', '');
SELECT pg_catalog.pg_extension_config_dump(
    pg_catalog.pg_get_serial_sequence('orca.runner_tokens', 'id')::regclass, '');

CREATE FUNCTION orca._token_hash(p_token text) RETURNS bytea
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT pg_catalog.sha256(pg_catalog.convert_to(p_token, 'UTF8'))
$$;

-- 32 bytes drawn from three v4 UUIDs (366 random bits from the server's
-- strong random source) through sha256.
CREATE FUNCTION orca._new_token() RETURNS text
LANGUAGE sql VOLATILE AS $$
    SELECT 'orca_rt_' || pg_catalog.encode(pg_catalog.sha256(
               pg_catalog.uuid_send(pg_catalog.gen_random_uuid())
               || pg_catalog.uuid_send(pg_catalog.gen_random_uuid())
               || pg_catalog.uuid_send(pg_catalog.gen_random_uuid())), 'hex')
$$;

-- The token this session presents (SET orca.runner_token), checked: its row,
-- or for an admin without a token a row with only org_id (the session's
-- org). Anyone else without a valid token is refused.
CREATE FUNCTION orca._runner_session() RETURNS orca.runner_tokens
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_token text := nullif(current_setting('orca.runner_token', true), '');
    v_named text := nullif(current_setting('orca.org', true), '');
    v_hash  bytea;
    t       orca.runner_tokens;
BEGIN
    IF v_token IS NULL THEN
        IF orca._is_admin() THEN
            t.org_id := orca.current_org_id();
            RETURN t;
        END IF;
        RAISE EXCEPTION 'role % presents no runner token: runners work with one', session_user
            USING ERRCODE = 'OR080',
                  HINT = 'an operator creates one with SELECT orca.create_runner_token(pool); '
                         'give it to orca-runner --token-file (or ORCA_RUNNER_TOKEN)';
    END IF;
    v_hash := orca._token_hash(v_token);
    SELECT * INTO t FROM orca.runner_tokens x WHERE x.hash = v_hash;
    IF NOT FOUND THEN
        SELECT * INTO t FROM orca.runner_tokens x
        WHERE x.previous_hash = v_hash AND x.previous_until > now();
    END IF;
    IF NOT FOUND THEN
        -- The token itself is never echoed: error messages reach logs.
        RAISE EXCEPTION 'runner token refused: it is not a token of this installation, or it was rotated'
            USING ERRCODE = 'OR080',
                  HINT = 'orca.runner_tokens lists the tokens by name; ask for a new one';
    END IF;
    IF t.revoked_at IS NOT NULL THEN
        RAISE EXCEPTION 'runner token ''%'' was revoked at %', t.name, t.revoked_at
            USING ERRCODE = 'OR080';
    END IF;
    IF v_named IS NOT NULL
       AND v_named <> (SELECT o.name FROM orca.orgs o WHERE o.id = t.org_id) THEN
        RAISE EXCEPTION 'runner token ''%'' is for org ''%'', not ''%''', t.name,
                        (SELECT o.name FROM orca.orgs o WHERE o.id = t.org_id), v_named
            USING ERRCODE = 'OR081',
                  HINT = 'leave orca.org unset: the token names its org';
    END IF;
    RETURN t;
END
$$;

-- A token session works for its pool only.
CREATE FUNCTION orca._runner_pool(t orca.runner_tokens, p_pool text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF t.id IS NOT NULL AND p_pool IS DISTINCT FROM t.pool THEN
        RAISE EXCEPTION 'runner token ''%'' is for pool ''%'', not %', t.name, t.pool,
                        quote_nullable(p_pool)
            USING ERRCODE = 'OR081';
    END IF;
END
$$;

-- Refuses a live lease of the org that another token's runner holds.
CREATE FUNCTION orca._lease_holder(t orca.runner_tokens, p_lease uuid) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_holder bigint;
BEGIN
    IF t.id IS NULL THEN
        RETURN;
    END IF;
    SELECT l.token_id INTO v_holder FROM orca.leases l
    WHERE l.attempt_id = orca._lease_attempt(p_lease) AND l.lease = p_lease
      AND l.org_id = t.org_id;
    IF FOUND AND v_holder IS DISTINCT FROM t.id THEN
        RAISE EXCEPTION 'lease % is held by another runner, not by token ''%''', p_lease, t.name
            USING ERRCODE = 'OR082',
                  HINT = 'a runner heartbeats, finishes and releases only the leases it claimed';
    END IF;
END
$$;

-- The org of the attempt a lease token was given for: the lease is the
-- capability, so no membership is asked. A session that names an org
-- (orca.org) must name the lease's.
CREATE FUNCTION orca._lease_org(p_lease uuid) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_named text := nullif(current_setting('orca.org', true), '');
    v_org   bigint;
BEGIN
    SELECT a.org_id INTO v_org FROM orca.attempts a
    WHERE a.id = orca._lease_attempt(p_lease) AND a.lease = p_lease;
    IF v_org IS NULL
       OR (v_named IS NOT NULL
           AND v_named IS DISTINCT FROM (SELECT o.name FROM orca.orgs o WHERE o.id = v_org)) THEN
        RAISE EXCEPTION 'unknown lease %', coalesce(p_lease::text, 'NULL')
            USING ERRCODE = 'OR012',
                  HINT = 'use the lease token orca.claim returned, in the org that claimed it';
    END IF;
    RETURN v_org;
END
$$;

CREATE FUNCTION orca.create_runner_token(pool text, name text DEFAULT NULL) RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('create_runner_token', 'pool', octet_length(create_runner_token.pool), 1024)
                         AND orca._bound('create_runner_token', 'name', octet_length(create_runner_token.name), 1024);
    v_org   bigint := orca.current_org_id();
    v_token text := orca._new_token();
    v_name  text := create_runner_token.name;
    v_id    bigint;
BEGIN
    IF create_runner_token.pool IS NULL OR length(create_runner_token.pool) NOT BETWEEN 1 AND 128 THEN
        RAISE EXCEPTION 'pool must be a name of 1 to 128 characters, got %',
                        quote_nullable(create_runner_token.pool)
            USING ERRCODE = 'OR050';
    END IF;
    IF v_name IS NOT NULL AND v_name !~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$' THEN
        RAISE EXCEPTION 'invalid runner token name %', quote_nullable(v_name)
            USING ERRCODE = 'OR050',
                  HINT = 'use 1 to 128 letters, digits, ''_'', ''.'' or ''-''';
    END IF;
    INSERT INTO orca.runner_tokens AS t (org_id, name, pool, hash)
    VALUES (v_org, coalesce(v_name, 'runner-' || substr(md5(v_token), 1, 8)),
            create_runner_token.pool, orca._token_hash(v_token))
    ON CONFLICT (org_id, name) DO NOTHING
    RETURNING t.id, t.name INTO v_id, v_name;
    IF v_id IS NULL THEN
        RAISE EXCEPTION 'runner token ''%'' already exists', create_runner_token.name
            USING ERRCODE = 'OR050',
                  HINT = 'orca.rotate_runner_token gives it a new secret';
    END IF;
    PERFORM orca._event(v_org, 'runner_token.created', NULL, NULL, NULL,
        jsonb_build_object('name', v_name, 'pool', create_runner_token.pool, 'by', session_user));
    RETURN v_token;
END
$$;
COMMENT ON FUNCTION orca.create_runner_token(text, text) IS
'Creates a runner token for a pool of the session''s org and returns it: shown this once, '
'stored only as its sha256. A runner given it (orca-runner --token-file, ORCA_RUNNER_TOKEN) '
'claims, heartbeats, finishes and releases only that pool''s attempts, in that org, and only '
'the leases it holds; its database login needs orca_runner and nothing else. Operators and '
'admins. Example: SELECT orca.create_runner_token(''default'', name => ''host-a'');';

CREATE FUNCTION orca.revoke_runner_token(name text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('revoke_runner_token', 'name', octet_length(revoke_runner_token.name), 1024);
    v_org bigint := orca.current_org_id();
    t     orca.runner_tokens;
    v_n   integer;
BEGIN
    UPDATE orca.runner_tokens x SET revoked_at = coalesce(x.revoked_at, now())
    WHERE x.org_id = v_org AND x.name = revoke_runner_token.name
    RETURNING * INTO t;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown runner token %', quote_nullable(revoke_runner_token.name)
            USING ERRCODE = 'OR083',
                  HINT = 'orca.runner_tokens lists the tokens of the org';
    END IF;
    -- Its leases lapse now: the next tick hands their attempts on.
    UPDATE orca.leases l SET deadline = least(l.deadline, now())
    WHERE l.org_id = v_org AND l.token_id = t.id;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    PERFORM orca._event(v_org, 'runner_token.revoked', NULL, NULL, NULL,
        jsonb_build_object('name', t.name, 'pool', t.pool, 'leases', v_n, 'by', session_user));
END
$$;
COMMENT ON FUNCTION orca.revoke_runner_token(text) IS
'Revokes a runner token: the runner''s next call is refused (OR080) and the leases it holds '
'lapse at once, so the next tick hands their attempts to other runners. Operators and admins.';

CREATE FUNCTION orca.rotate_runner_token(name text, grace interval DEFAULT '1 hour')
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('rotate_runner_token', 'name', octet_length(rotate_runner_token.name), 1024);
    v_org   bigint := orca.current_org_id();
    v_token text := orca._new_token();
    t       orca.runner_tokens;
BEGIN
    IF rotate_runner_token.grace IS NULL OR rotate_runner_token.grace < interval '0'
       OR rotate_runner_token.grace > interval '7 days' THEN
        RAISE EXCEPTION 'grace must be from 0 to 7 days, got %',
                        coalesce(rotate_runner_token.grace::text, 'NULL')
            USING ERRCODE = 'OR050';
    END IF;
    UPDATE orca.runner_tokens x
    SET previous_hash = x.hash, previous_until = now() + rotate_runner_token.grace,
        hash = orca._token_hash(v_token), rotated_at = now()
    WHERE x.org_id = v_org AND x.name = rotate_runner_token.name AND x.revoked_at IS NULL
    RETURNING * INTO t;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown or revoked runner token %', quote_nullable(rotate_runner_token.name)
            USING ERRCODE = 'OR083',
                  HINT = 'orca.runner_tokens lists the tokens of the org';
    END IF;
    PERFORM orca._event(v_org, 'runner_token.rotated', NULL, NULL, NULL,
        jsonb_build_object('name', t.name, 'pool', t.pool, 'old_until', t.previous_until,
                           'by', session_user));
    RETURN v_token;
END
$$;
COMMENT ON FUNCTION orca.rotate_runner_token(text, interval) IS
'Gives a runner token a new secret and returns it (shown this once). The old secret keeps '
'working for grace (default 1 hour, at most 7 days; 0 ends it now), so runners can be given '
'the new one without a gap. Operators and admins. '
'Example: SELECT orca.rotate_runner_token(''host-a'', interval ''10 minutes'');';

CREATE FUNCTION orca._sync_caller(p_sync text, p_lease uuid, p_what text) RETURNS orca.attempts
LANGUAGE plpgsql AS $$
DECLARE
    a     orca.attempts;
    r     orca.runs;
    v_org bigint;
BEGIN
    IF p_lease IS NULL THEN
        IF orca._is_admin() THEN
            a.org_id := orca.current_org_id();
            RETURN a;
        END IF;
        RAISE EXCEPTION '% sync % needs the lease of an attempt of its run', p_what,
                        quote_nullable(p_sync)
            USING ERRCODE = 'OR084',
                  HINT = 'the runner gives orca-engine the lease (ORCA_LEASE); only admins drive a sync without one';
    END IF;
    v_org := orca._lease_org(p_lease);
    SELECT * INTO a FROM orca.attempts x
    WHERE x.id = orca._lease_attempt(p_lease) AND x.lease = p_lease AND x.org_id = v_org;
    -- An attempt stopping because its run was cancelled may still commit
    -- (or rewind) its epoch in flight, for a lease's length: that is what
    -- stopping at a resume point means. Claiming needs a live lease.
    IF NOT (a.status = 'leased'
            OR (a.status = 'cancelled' AND p_what <> 'claiming'
                AND a.finished_at > now() - make_interval(secs => orca._lease_seconds()))) THEN
        PERFORM orca._lease_refused(v_org, p_lease);
    END IF;
    SELECT * INTO r FROM orca.runs WHERE id = a.run_id;
    IF r.kind <> 'sync'
       OR (SELECT p.name FROM orca.pipelines p WHERE p.id = r.pipeline_id) IS DISTINCT FROM p_sync THEN
        RAISE EXCEPTION 'lease % is an attempt of run %, not of sync %', p_lease, r.id,
                        quote_nullable(p_sync)
            USING ERRCODE = 'OR084';
    END IF;
    RETURN a;
END
$$;

CREATE FUNCTION orca._check_record(s orca.syncs, p_record text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_prefix text := (SELECT o.name FROM orca.orgs o WHERE o.id = s.org_id) || '/' || s.name
                     || '/_checkpoints/';
BEGIN
    IF p_record IS NOT NULL
       AND (NOT starts_with(p_record, v_prefix)
            OR substr(p_record, length(v_prefix) + 1) !~ '^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,254}$'
            OR strpos(p_record, '..') > 0) THEN
        RAISE EXCEPTION 'checkpoint record % is not under the prefix % of sync ''%''',
                        quote_literal(p_record), v_prefix, s.name
            USING ERRCODE = 'OR085',
                  HINT = 'records are objects <org>/<sync>/_checkpoints/<name> of the sync''s own store prefix';
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION orca._tick_orgs() RETURNS bigint[]
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF nullif(current_setting('orca.runner_token', true), '') IS NOT NULL THEN
        RETURN ARRAY[(orca._runner_session()).org_id];
    END IF;
    IF nullif(current_setting('orca.org', true), '') IS NULL AND orca._is_admin() THEN
        RETURN ARRAY(SELECT id FROM orca.orgs ORDER BY id);
    END IF;
    RETURN ARRAY[orca.current_org_id()];
END
$$;

CREATE OR REPLACE FUNCTION orca.register_runner(name text, pool text DEFAULT 'default',
                                     slots integer DEFAULT NULL, host text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('register_runner', 'name', octet_length(register_runner.name), 1024)
                         AND orca._bound('register_runner', 'pool', octet_length(register_runner.pool), 1024)
                         AND orca._bound('register_runner', 'host', octet_length(register_runner.host), 1024);
    t     orca.runner_tokens := orca._runner_session();
    v_org bigint := t.org_id;
BEGIN
    PERFORM orca._runner_pool(t, coalesce(register_runner.pool, 'default'));
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

CREATE OR REPLACE FUNCTION orca.heartbeat(lease uuid) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    t     orca.runner_tokens := orca._runner_session();
    v_org bigint := t.org_id;
    v_deadline timestamptz;
BEGIN
    UPDATE orca.leases l
    SET deadline = now() + make_interval(secs => orca._lease_seconds()), heartbeat_at = now()
    WHERE l.attempt_id = orca._lease_attempt(heartbeat.lease) AND l.lease = heartbeat.lease
      AND l.org_id = v_org AND (t.id IS NULL OR l.token_id = t.id)
    RETURNING l.deadline INTO v_deadline;
    IF v_deadline IS NULL THEN
        PERFORM orca._lease_holder(t, heartbeat.lease);
        PERFORM orca._lease_refused(v_org, heartbeat.lease);
    END IF;
    RETURN v_deadline;
END
$$;
COMMENT ON FUNCTION orca.heartbeat(uuid) IS
'Extends a lease by orca.lease_seconds and returns the new deadline. Errors: OR012 unknown '
'lease, OR014 lease no longer active (lost or finished: stop the attempt), OR015 run cancelled '
'(stop the attempt).';

CREATE OR REPLACE FUNCTION orca.finish(lease uuid, ok boolean, error text DEFAULT NULL) RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('finish', 'error', octet_length(finish.error), 65536);
    t     orca.runner_tokens := orca._runner_session();
    v_org bigint := t.org_id;
    a     orca.attempts;
BEGIN
    IF finish.ok IS NULL THEN
        RAISE EXCEPTION 'ok must be true or false, got NULL' USING ERRCODE = 'OR050';
    END IF;
    PERFORM orca._lease_holder(t, finish.lease);
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

CREATE OR REPLACE FUNCTION orca.finish_many(leases uuid[], ok boolean DEFAULT true, error text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('finish_many', 'error', octet_length(finish_many.error), 65536);
    t     orca.runner_tokens := orca._runner_session();
    v_org bigint := t.org_id;
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
    IF t.id IS NOT NULL THEN
        -- Only leases this token's runner holds, all or nothing.
        SELECT x INTO v_bad FROM unnest(finish_many.leases) AS x
        WHERE EXISTS (SELECT 1 FROM orca.leases l
                      WHERE l.attempt_id = orca._lease_attempt(x) AND l.lease = x
                        AND l.org_id = v_org AND l.token_id IS DISTINCT FROM t.id)
        LIMIT 1;
        IF FOUND THEN
            PERFORM orca._lease_holder(t, v_bad);
        END IF;
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

CREATE OR REPLACE FUNCTION orca.release(lease uuid, reason text DEFAULT NULL) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('release', 'reason', octet_length(release.reason), 65536);
    t     orca.runner_tokens := orca._runner_session();
    v_org bigint := t.org_id;
    a     orca.attempts;
    v_why text := coalesce(release.reason, 'released by its runner');
    v_recent integer;
BEGIN
    PERFORM orca._lease_holder(t, release.lease);
    a := orca._leased_attempt(v_org, release.lease);
    -- A run handed back again and again (an engine that asks for a new
    -- attempt each time it starts, a runner restarting in a loop) would go
    -- round with no pause and no end: past a bound the attempt fails, and
    -- the run's retries (and a continuous sync's backoff) take over.
    SELECT count(*) INTO v_recent FROM orca.attempts x
    WHERE x.run_id = a.run_id AND x.status = 'released'
      AND x.finished_at > now() - interval '10 minutes';
    IF v_recent >= 10 THEN
        PERFORM orca._attempt_ended(a.id, 'failed',
            format('handed back %s times in 10 minutes; the last time: %s', v_recent + 1, v_why));
        RETURN;
    END IF;
    PERFORM orca._attempt_ended(a.id, 'released', v_why);
END
$$;
COMMENT ON FUNCTION orca.release(uuid, text) IS
'Hands a leased attempt back unfinished, for a runner that is shutting down or an engine that '
'asks for a new attempt (a continuous sync meeting a new table shape): the run gets a new '
'pending attempt at once, and neither run_retries nor the lost-attempt budget is spent. A run '
'handed back 10 times in 10 minutes is in a loop: the 11th attempt fails instead (its error '
'says so), and the run''s retries decide. Errors: OR012/OR014/OR015 for the lease.';

CREATE OR REPLACE FUNCTION orca.report_step(lease uuid, step text, partition text, status text,
                                 error text DEFAULT NULL, output jsonb DEFAULT NULL,
                                 code text DEFAULT NULL, input_hash text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('report_step', 'step', octet_length(report_step.step), 1024)
                         AND orca._bound('report_step', 'partition', octet_length(report_step.partition), 1024)
                         AND orca._bound('report_step', 'status', octet_length(report_step.status), 1024)
                         AND orca._bound('report_step', 'error', octet_length(report_step.error), 65536)
                         AND orca._bound('report_step', 'output', octet_length(report_step.output::text), 1048576)
                         AND orca._bound('report_step', 'code', octet_length(report_step.code), 1024)
                         AND orca._bound('report_step', 'input_hash', octet_length(report_step.input_hash), 1024);
    v_org bigint := orca._lease_org(report_step.lease);
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

CREATE OR REPLACE FUNCTION orca.attempt_context(lease uuid, build jsonb DEFAULT '{}') RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('attempt_context', 'build', octet_length(attempt_context.build::text), 65536);
    v_org bigint := orca._lease_org(attempt_context.lease);
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

CREATE OR REPLACE FUNCTION orca.pin_read(lease uuid, step text, partition text, dataset text, snapshot bigint)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('pin_read', 'step', octet_length(pin_read.step), 1024)
                         AND orca._bound('pin_read', 'partition', octet_length(pin_read.partition), 1024)
                         AND orca._bound('pin_read', 'dataset', octet_length(pin_read.dataset), 1024);
    v_org bigint := orca._lease_org(pin_read.lease);
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

CREATE OR REPLACE FUNCTION orca.record_commit(lease uuid, step text, partition text, dataset text,
                                   snapshot bigint, commit_no integer,
                                   operation text DEFAULT 'append')
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('record_commit', 'step', octet_length(record_commit.step), 1024)
                         AND orca._bound('record_commit', 'partition', octet_length(record_commit.partition), 1024)
                         AND orca._bound('record_commit', 'dataset', octet_length(record_commit.dataset), 1024)
                         AND orca._bound('record_commit', 'operation', octet_length(record_commit.operation), 1024);
    v_org bigint := orca._lease_org(record_commit.lease);
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

CREATE OR REPLACE FUNCTION orca.sense_context(lease uuid) RETURNS jsonb
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

CREATE OR REPLACE FUNCTION orca.report_snapshots(lease uuid, snapshots jsonb) RETURNS integer
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

CREATE OR REPLACE FUNCTION orca.keys_context(lease uuid) RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_org bigint := orca._lease_org(keys_context.lease);
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

CREATE OR REPLACE FUNCTION orca.claim_sync(sync text, lease uuid DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('claim_sync', 'sync', octet_length(claim_sync.sync), 1024);
    a     orca.attempts := orca._sync_caller(claim_sync.sync, claim_sync.lease, 'claiming');
    v_org bigint := a.org_id;
    s orca.syncs;
    r orca.runs;
BEGIN
    -- A run's attempt says which run it is: its lease must be live and of
    -- this sync (locks run, then attempt, then the sync, as finish does).
    IF claim_sync.lease IS NOT NULL THEN
        a := orca._leased_attempt(v_org, claim_sync.lease);
        SELECT * INTO r FROM orca.runs WHERE id = a.run_id;
    END IF;
    s := orca._sync(v_org, claim_sync.sync);
    -- A HEAD set under an older rule or by hand: the engine checks it too.
    PERFORM orca._check_record(s, s.head_record);
    -- A definition made before passwords were refused still runs, with a
    -- warning on every claim until it is defined again with a secret.
    IF cardinality(orca._inline_passwords(s.definition)) > 0 THEN
        PERFORM orca._event(v_org, 'sync.inline_password', r.pipeline_id, r.id, a.id,
            jsonb_build_object('sync', s.name, 'at', to_jsonb(orca._inline_passwords(s.definition)),
                               'hint', 'keep the connection string in a secret (orca.set_secret) '
                                       'and define the sync again with {"secret": "name"}'));
    END IF;
    UPDATE orca.syncs SET generation = generation + 1 WHERE id = s.id RETURNING * INTO s;
    PERFORM orca._event(v_org, 'sync.claimed', r.pipeline_id, r.id, a.id,
        jsonb_build_object('sync', s.name, 'generation', s.generation, 'epoch', s.head_epoch));
    RETURN jsonb_build_object('sync', s.name, 'generation', s.generation,
                              'epoch', s.head_epoch, 'record', s.head_record,
                              'definition', s.definition, 'run', r.id,
                              'request', coalesce(r.request, '{}'::jsonb),
                              'allowlist', to_jsonb(orca._allowlist(v_org)),
                              'catalog', (SELECT jsonb_build_object('version', c.version,
                                                                    'streams', c.catalog->'streams')
                                          FROM orca.catalogs c
                                          WHERE c.org_id = v_org AND c.name = s.name
                                            AND c.version = s.catalog_version));
END
$$;
COMMENT ON FUNCTION orca.claim_sync(text, uuid) IS
'An attempt claims a sync before it moves data: the sync''s generation goes up by one, which '
'fences every older attempt (their next orca.advance_head fails with OR070). Returns the new '
'generation, the HEAD epoch and record to recover from, the definition, and with the lease of '
'a run''s attempt (which must be live: OR012/OR014/OR015 otherwise) the run and its request '
'({"mode": "full"} for a backfill: read everything again), and the org''s netguard allowlist '
'(what its connectors may reach besides public addresses), and the catalog version the streams '
'were planned from (its streams), which the attempt checks the source against. '
'The lease is required (OR084) '
'except for admins, who may drive a sync by hand in their session''s org.';

REVOKE ALL ON orca.runner_tokens FROM PUBLIC;
REVOKE ALL ON SEQUENCE orca.runner_tokens_id_seq FROM PUBLIC;
REVOKE SELECT ON orca.attempts, orca.leases FROM orca_viewer;
GRANT SELECT (org_id, id, run_id, version_id, number, status, runner, pool, created_at,
              leased_at, heartbeat_at, deadline, finished_at, error, build)
    ON orca.attempts TO orca_viewer;
GRANT SELECT (org_id, attempt_id, runner, deadline, heartbeat_at, token_id)
    ON orca.leases TO orca_viewer;
GRANT SELECT (org_id, id, name, pool, previous_until, created_at, created_by, rotated_at,
              revoked_at)
    ON orca.runner_tokens TO orca_viewer;
GRANT USAGE ON SCHEMA orca TO orca_attempt;
GRANT EXECUTE ON FUNCTION orca.current_org_id(), orca._may_use_org(bigint) TO orca_attempt;
REVOKE ALL ON FUNCTION
    orca._token_hash(text),
    orca._new_token(),
    orca._runner_session(),
    orca._runner_pool(orca.runner_tokens, text),
    orca._lease_holder(orca.runner_tokens, uuid),
    orca._lease_org(uuid),
    orca._sync_caller(text, uuid, text),
    orca._check_record(orca.syncs, text),
    orca.create_runner_token(text, text),
    orca.revoke_runner_token(text),
    orca.rotate_runner_token(text, interval),
    orca.advance_head(text, integer, bigint, text, uuid),
    orca.rewind_head(text, integer, bigint, text, uuid)
FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    orca.create_runner_token(text, text),
    orca.revoke_runner_token(text),
    orca.rotate_runner_token(text, interval)
    TO orca_operator;
REVOKE EXECUTE ON FUNCTION
    orca.report_step(uuid, text, text, text, text, jsonb, text, text),
    orca.attempt_context(uuid, jsonb),
    orca.pin_read(uuid, text, text, text, bigint),
    orca.sense_context(uuid),
    orca.report_snapshots(uuid, jsonb),
    orca.keys_context(uuid),
    orca.report_keys(uuid, bigint, bigint, text[]),
    orca.claim_sync(text, uuid),
    orca.record_commit(uuid, text, text, text, bigint, integer, text)
    FROM orca_runner;
GRANT EXECUTE ON FUNCTION
    orca.report_step(uuid, text, text, text, text, jsonb, text, text),
    orca.attempt_context(uuid, jsonb),
    orca.pin_read(uuid, text, text, text, bigint),
    orca.sense_context(uuid),
    orca.report_snapshots(uuid, jsonb),
    orca.keys_context(uuid),
    orca.report_keys(uuid, bigint, bigint, text[]),
    orca.claim_sync(text, uuid),
    orca.advance_head(text, integer, bigint, text, uuid),
    orca.rewind_head(text, integer, bigint, text, uuid),
    orca.record_commit(uuid, text, text, text, bigint, integer, text)
    TO orca_attempt;
-- The Iceberg catalog is written by the children (orca_attempt), which
-- runners include.
REVOKE ALL ON public.iceberg_tables, public.iceberg_namespace_properties FROM orca_runner;
GRANT SELECT, INSERT, UPDATE, DELETE ON public.iceberg_tables, public.iceberg_namespace_properties
    TO orca_attempt;

-- The Iceberg catalog is org-scoped like every other table: by the lease a
-- pipeline binary presents, or by membership.
CREATE FUNCTION orca._lease_usable_org(p_lease uuid) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT a.org_id FROM orca.attempts a
    WHERE a.id = orca._lease_attempt(p_lease) AND a.lease = p_lease
      AND (a.status = 'leased'
           OR (a.status = 'cancelled'
               AND a.finished_at > now() - make_interval(secs => orca._lease_seconds())))
$$;

CREATE FUNCTION orca._catalog_visible(p_catalog text) RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_lease text := nullif(current_setting('orca.lease', true), '');
BEGIN
    IF orca._is_admin() THEN
        RETURN true;
    END IF;
    IF v_lease IS NOT NULL THEN
        IF v_lease !~ '^[0-9a-fA-F]{8}-?([0-9a-fA-F]{4}-?){3}[0-9a-fA-F]{12}$' THEN
            RETURN false;
        END IF;
        RETURN EXISTS (SELECT 1 FROM orca.orgs o
                       WHERE o.id = orca._lease_usable_org(v_lease::uuid) AND o.name = p_catalog);
    END IF;
    RETURN EXISTS (SELECT 1 FROM orca.orgs o WHERE o.name = p_catalog AND orca._may_use_org(o.id));
END
$$;
ALTER TABLE public.iceberg_tables ENABLE ROW LEVEL SECURITY;
CREATE POLICY org_scope ON public.iceberg_tables
    USING (orca._catalog_visible(catalog_name)) WITH CHECK (orca._catalog_visible(catalog_name));
ALTER TABLE public.iceberg_namespace_properties ENABLE ROW LEVEL SECURITY;
CREATE POLICY org_scope ON public.iceberg_namespace_properties
    USING (orca._catalog_visible(catalog_name)) WITH CHECK (orca._catalog_visible(catalog_name));
REVOKE ALL ON FUNCTION orca._lease_usable_org(uuid), orca._catalog_visible(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION orca._catalog_visible(text) TO orca_viewer, orca_runner, orca_attempt;

---------------------------------------------------------------------------
-- Secrets (sql/security.sql): values encrypted with per-org data keys,
-- which the installation key (orca.secrets_key_file) wraps.
---------------------------------------------------------------------------

-- Secrets: values encrypted with their org's data key, which is wrapped by
-- the installation's key (a file outside the database, named by
-- orca.secrets_key_file). Only ciphertext is stored; viewers see names.
CREATE TABLE orca.org_keys (
    org_id       bigint PRIMARY KEY REFERENCES orca.orgs (id),
    -- key id (8 bytes) || nonce || the data key sealed by the installation key
    wrapped      bytea NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    rewrapped_at timestamptz
);
COMMENT ON TABLE orca.org_keys IS
'Each org''s data key, wrapped by the installation''s key (orca.secrets_key_file).';

CREATE TABLE orca.secrets (
    org_id     bigint NOT NULL REFERENCES orca.orgs (id),
    name       text NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9_.-]{0,127}$'),
    -- nonce || the value sealed by the org's data key, bound to org and name
    sealed     bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    created_by name NOT NULL DEFAULT session_user,
    updated_at timestamptz NOT NULL DEFAULT now(),
    updated_by name NOT NULL DEFAULT session_user,
    PRIMARY KEY (org_id, name)
);
COMMENT ON TABLE orca.secrets IS
'Secrets (orca.set_secret): connector options write {"secret": "name"} where a password would '
'be. Values are encrypted; viewers see names and dates only.';

DO $secrets$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['org_keys', 'secrets'] LOOP
        EXECUTE format('ALTER TABLE orca.%I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('CREATE POLICY org_scope ON orca.%I USING (org_id = (SELECT orca.current_org_id()))', t);
        PERFORM pg_catalog.pg_extension_config_dump(('orca.' || t)::regclass, '');
    END LOOP;
END
$secrets$;

CREATE  FUNCTION "_new_data_key"(
	"org" bigint /* i64 */
) RETURNS jsonb /* JsonB */
STRICT VOLATILE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'new_data_key_wrapper';

CREATE  FUNCTION "_seal_secret"(
	"wrapped" bytea, /* & [u8] */
	"org" bigint, /* i64 */
	"name" TEXT, /* & str */
	"value" TEXT /* & str */
) RETURNS jsonb /* JsonB */
STRICT VOLATILE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'seal_secret_wrapper';

CREATE  FUNCTION "_open_secret"(
	"wrapped" bytea, /* & [u8] */
	"org" bigint, /* i64 */
	"name" TEXT, /* & str */
	"sealed" bytea /* & [u8] */
) RETURNS jsonb /* JsonB */
STRICT VOLATILE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'open_secret_wrapper';

CREATE  FUNCTION "_rewrap_data_key"(
	"wrapped" bytea, /* & [u8] */
	"org" bigint /* i64 */
) RETURNS jsonb /* JsonB */
STRICT VOLATILE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'rewrap_data_key_wrapper';

CREATE  FUNCTION "_inline_passwords"(
	"definition" jsonb /* JsonB */
) RETURNS TEXT[] /* Vec < String > */
IMMUTABLE STRICT PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'inline_passwords_wrapper';

CREATE FUNCTION orca._org_data_key(p_org bigint) RETURNS bytea
LANGUAGE plpgsql AS $$
DECLARE
    v bytea;
BEGIN
    SELECT k.wrapped INTO v FROM orca.org_keys k WHERE k.org_id = p_org;
    IF v IS NULL THEN
        INSERT INTO orca.org_keys (org_id, wrapped)
        VALUES (p_org, decode(orca._unwrap(orca._new_data_key(p_org)) #>> '{}', 'hex'))
        ON CONFLICT (org_id) DO NOTHING;
        SELECT k.wrapped INTO v FROM orca.org_keys k WHERE k.org_id = p_org;
    END IF;
    RETURN v;
END
$$;

CREATE FUNCTION orca._check_secret_name(p_name text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_name IS NULL OR p_name !~ '^[a-z0-9][a-z0-9_.-]{0,127}$' THEN
        RAISE EXCEPTION 'invalid secret name %', quote_nullable(p_name)
            USING ERRCODE = 'OR091',
                  HINT = 'use 1 to 128 lowercase letters, digits, ''_'', ''-'' or ''.''';
    END IF;
END
$$;

CREATE FUNCTION orca.set_secret(name text, value text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('set_secret', 'name', octet_length(set_secret.name), 1024)
                         AND orca._bound('set_secret', 'value', octet_length(set_secret.value), 65536);
    v_org    bigint := orca.current_org_id();
    v_sealed bytea;
BEGIN
    PERFORM orca._check_secret_name(set_secret.name);
    IF set_secret.value IS NULL OR length(set_secret.value) NOT BETWEEN 1 AND 65536 THEN
        RAISE EXCEPTION 'the value of secret % must be 1 to 65536 characters, got %',
                        set_secret.name, coalesce(length(set_secret.value)::text, 'NULL')
            USING ERRCODE = 'OR050';
    END IF;
    v_sealed := decode(orca._unwrap(orca._seal_secret(orca._org_data_key(v_org), v_org,
                                                      set_secret.name, set_secret.value)) #>> '{}',
                       'hex');
    INSERT INTO orca.secrets AS s (org_id, name, sealed)
    VALUES (v_org, set_secret.name, v_sealed)
    ON CONFLICT (org_id, name) DO UPDATE
    SET sealed = excluded.sealed, updated_at = now(), updated_by = session_user;
    PERFORM orca._event(v_org, 'secret.set', NULL, NULL, NULL,
        jsonb_build_object('name', set_secret.name, 'by', session_user));
END
$$;
COMMENT ON FUNCTION orca.set_secret(text, text) IS
'Keeps a secret of the session''s org, encrypted (AES-256-GCM with the org''s data key, which '
'the installation key in orca.secrets_key_file wraps); setting it again replaces the value. '
'Connector options name it as {"secret": "name"}; runners read it under an attempt''s lease. '
'Operators and admins. Errors: OR091 invalid name, OR050 empty or over 64 KiB, OR090 secrets '
'not set up. Example: SELECT orca.set_secret(''shop-db'', ''postgres://app:pw@db/shop'');';

CREATE FUNCTION orca.drop_secret(name text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('drop_secret', 'name', octet_length(drop_secret.name), 1024);
    v_org bigint := orca.current_org_id();
BEGIN
    DELETE FROM orca.secrets s WHERE s.org_id = v_org AND s.name = drop_secret.name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown secret % in org ''%''', quote_nullable(drop_secret.name),
                        (SELECT o.name FROM orca.orgs o WHERE o.id = v_org)
            USING ERRCODE = 'OR091', HINT = 'orca.secrets lists the org''s secrets';
    END IF;
    PERFORM orca._event(v_org, 'secret.dropped', NULL, NULL, NULL,
        jsonb_build_object('name', drop_secret.name, 'by', session_user));
END
$$;
COMMENT ON FUNCTION orca.drop_secret(text) IS
'Drops a secret of the session''s org. Operators and admins. OR091 for an unknown name.';

CREATE FUNCTION orca.attempt_secret(lease uuid, name text) RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('attempt_secret', 'name', octet_length(attempt_secret.name), 1024);
    v_org    bigint;
    v_sealed bytea;
    v_value  text;
BEGIN
    IF attempt_secret.lease IS NULL AND orca._is_admin() THEN
        v_org := orca.current_org_id();
    ELSE
        v_org := orca._lease_usable_org(attempt_secret.lease);
        IF v_org IS NULL
           OR v_org IS DISTINCT FROM orca._lease_org(attempt_secret.lease) THEN
            PERFORM orca._lease_refused(orca._lease_org(attempt_secret.lease), attempt_secret.lease);
        END IF;
    END IF;
    PERFORM orca._check_secret_name(attempt_secret.name);
    SELECT s.sealed INTO v_sealed FROM orca.secrets s
    WHERE s.org_id = v_org AND s.name = attempt_secret.name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown secret % in org ''%''', quote_nullable(attempt_secret.name),
                        (SELECT o.name FROM orca.orgs o WHERE o.id = v_org)
            USING ERRCODE = 'OR091',
                  HINT = 'an operator sets it with orca.set_secret(name, value)';
    END IF;
    v_value := orca._unwrap(orca._open_secret(orca._org_data_key(v_org), v_org,
                                              attempt_secret.name, v_sealed)) #>> '{}';
    PERFORM orca._event(v_org, 'secret.read', NULL, NULL,
        orca._lease_attempt(attempt_secret.lease),
        jsonb_strip_nulls(jsonb_build_object('name', attempt_secret.name,
                                             'by', CASE WHEN attempt_secret.lease IS NULL
                                                        THEN session_user END)));
    RETURN v_value;
END
$$;
COMMENT ON FUNCTION orca.attempt_secret(uuid, text) IS
'A secret''s value, for the attempt whose live lease is given (the engine and runners resolve '
'{"secret": "name"} options with it at attempt time); the installation''s admin (a login, '
'never an API key) may pass a NULL lease for the session''s org. Each read is an event (secret.read). Errors: OR012/OR014/OR015 for the lease, '
'OR091 unknown secret, OR090/OR092 keys.';

CREATE FUNCTION orca.rewrap_data_keys() RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    k   record;
    r   jsonb;
    v_n integer := 0;
BEGIN
    PERFORM orca._installation_admin();
    IF NOT orca._is_admin() THEN
        RAISE EXCEPTION 'only admins rewrap the data keys' USING ERRCODE = '42501';
    END IF;
    FOR k IN SELECT * FROM orca.org_keys ORDER BY org_id FOR UPDATE LOOP
        r := orca._unwrap(orca._rewrap_data_key(k.wrapped, k.org_id));
        IF (r->>'changed')::boolean THEN
            UPDATE orca.org_keys SET wrapped = decode(r->>'wrapped', 'hex'), rewrapped_at = now()
            WHERE org_id = k.org_id;
            PERFORM orca._event(k.org_id, 'secrets.rewrapped', NULL, NULL, NULL,
                                jsonb_build_object('by', session_user));
            v_n := v_n + 1;
        END IF;
    END LOOP;
    RETURN v_n;
END
$$;
COMMENT ON FUNCTION orca.rewrap_data_keys() IS
'Rotates the installation key: with the new key in orca.secrets_key_file and the old one in '
'orca.secrets_previous_key_file, wraps every org''s data key with the new key (values are not '
're-encrypted: the data keys stay the same) and returns how many changed. Then unset '
'orca.secrets_previous_key_file. Admins only.';

REVOKE ALL ON orca.org_keys, orca.secrets FROM PUBLIC;
GRANT SELECT (org_id, name, created_at, created_by, updated_at, updated_by)
    ON orca.secrets TO orca_viewer;
GRANT SELECT (org_id, created_at, rewrapped_at) ON orca.org_keys TO orca_viewer;
REVOKE ALL ON FUNCTION
    orca._new_data_key(bigint),
    orca._seal_secret(bytea, bigint, text, text),
    orca._open_secret(bytea, bigint, text, bytea),
    orca._rewrap_data_key(bytea, bigint),
    orca._inline_passwords(jsonb),
    orca._org_data_key(bigint),
    orca._check_secret_name(text),
    orca.set_secret(text, text),
    orca.drop_secret(text),
    orca.attempt_secret(uuid, text),
    orca.rewrap_data_keys()
FROM PUBLIC;
GRANT EXECUTE ON FUNCTION orca.set_secret(text, text), orca.drop_secret(text) TO orca_operator;
GRANT EXECUTE ON FUNCTION orca.attempt_secret(uuid, text) TO orca_attempt;
GRANT EXECUTE ON FUNCTION orca.rewrap_data_keys() TO orca_admin;

-- Syncs defined with a password in their definition keep working; each
-- claim warns (orca.claim_sync), and so does the upgrade, once per sync.
SELECT orca._event(s.org_id, 'sync.inline_password', NULL, NULL, NULL,
                   jsonb_build_object('sync', s.name, 'at', to_jsonb(orca._inline_passwords(s.definition)),
                                      'hint', 'keep the connection string in a secret (orca.set_secret) '
                                              'and define the sync again with {"secret": "name"}'))
FROM orca.syncs s
WHERE cardinality(orca._inline_passwords(s.definition)) > 0;

---------------------------------------------------------------------------
-- Netguard (sql/security.sql): each org's allowlist of what its connectors
-- may reach besides public addresses; create_sync judges what a definition
-- names as written, and claim_sync hands the engine the allowlist.
---------------------------------------------------------------------------

CREATE  FUNCTION "_allow_rule"(
	"target" TEXT /* & str */
) RETURNS jsonb /* JsonB */
IMMUTABLE STRICT PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'allow_rule_wrapper';

CREATE  FUNCTION "_netguard_definition"(
	"org" TEXT, /* & str */
	"definition" jsonb, /* JsonB */
	"allowlist" TEXT[] /* Vec < String > */
) RETURNS jsonb /* JsonB */
IMMUTABLE STRICT PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'netguard_definition_wrapper';

CREATE  FUNCTION "_allowlist_for"(
	"definition" jsonb /* JsonB */
) RETURNS TEXT[] /* Vec < String > */
IMMUTABLE STRICT PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'allowlist_for_wrapper';
-- Netguard's allowlist (orca_core::netguard decides; docs/security.md): what
-- an org's connectors may reach besides public addresses — host names,
-- networks, and local directories. Engines read it with their sync's claim
-- and check every address a name resolves to against it before connecting,
-- and every local path after resolving its symlinks. Admins manage it.
CREATE TABLE orca.allowlist (
    org_id     bigint NOT NULL REFERENCES orca.orgs (id),
    -- as orca._allow_rule normalises it: 'db.internal', '*.corp.example',
    -- '10.0.0.0/8', '127.0.0.1/32', '/srv/data'
    target     text NOT NULL,
    kind       text NOT NULL CHECK (kind IN ('host', 'network', 'path')),
    note       text,
    created_at timestamptz NOT NULL DEFAULT now(),
    created_by name NOT NULL DEFAULT session_user,
    PRIMARY KEY (org_id, target)
);
COMMENT ON TABLE orca.allowlist IS
'What an org''s connectors may reach besides public addresses (orca.allow): host names, '
'networks and local directories. Loopback, private, link-local, metadata and other non-public '
'addresses, and every local path, are refused unless an entry permits them.';
ALTER TABLE orca.allowlist ENABLE ROW LEVEL SECURITY;
CREATE POLICY org_scope ON orca.allowlist USING (org_id = (SELECT orca.current_org_id()));
SELECT pg_catalog.pg_extension_config_dump('orca.allowlist', '');

CREATE FUNCTION orca._allowlist(p_org bigint) RETURNS text[]
LANGUAGE sql STABLE AS $$
    SELECT coalesce(array_agg(a.target ORDER BY a.target), '{}')
    FROM orca.allowlist a WHERE a.org_id = p_org
$$;

-- An org named by an admin's call, or OR001.
CREATE FUNCTION orca._org_named(p_name text) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_org bigint;
BEGIN
    SELECT o.id INTO v_org FROM orca.orgs o WHERE o.name = p_name;
    IF v_org IS NULL THEN
        RAISE EXCEPTION 'unknown org %', quote_nullable(p_name) USING ERRCODE = 'OR001';
    END IF;
    RETURN v_org;
END
$$;

CREATE FUNCTION orca.allow(org text, target text, note text DEFAULT NULL) RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('allow', 'org', octet_length(allow.org), 1024)
                         AND orca._bound('allow', 'target', octet_length(allow.target), 4096)
                         AND orca._bound('allow', 'note', octet_length(allow.note), 4096);
    v_org  bigint := orca._org_named(allow.org);
    v_rule jsonb;
BEGIN
    PERFORM orca._installation_admin();
    IF allow.target IS NULL THEN
        RAISE EXCEPTION 'invalid allowlist entry NULL' USING ERRCODE = 'OR093';
    END IF;
    v_rule := orca._unwrap(orca._allow_rule(allow.target));
    INSERT INTO orca.allowlist AS a (org_id, target, kind, note)
    VALUES (v_org, v_rule->>'target', v_rule->>'kind', allow.note)
    ON CONFLICT (org_id, target) DO UPDATE SET note = coalesce(excluded.note, a.note);
    PERFORM orca._event(v_org, 'allowlist.added', NULL, NULL, NULL,
        jsonb_build_object('target', v_rule->>'target', 'kind', v_rule->>'kind',
                           'by', session_user));
    RETURN v_rule->>'target';
END
$$;
COMMENT ON FUNCTION orca.allow(text, text, text) IS
'Lets an org''s connectors reach a host name (''db.internal''), every subdomain of one '
'(''*.corp.example''), a network (''10.0.0.0/8'', ''127.0.0.1'') or a local directory '
'(''/srv/data'') that netguard refuses otherwise; returns the entry as stored. Public '
'addresses need no entry. Admins only. Errors: OR001 unknown org, OR093 invalid entry. '
'Example: SELECT orca.allow(''acme'', ''10.20.0.0/16'', note => ''the warehouse VPC'');';

CREATE FUNCTION orca.disallow(org text, target text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('disallow', 'org', octet_length(disallow.org), 1024)
                         AND orca._bound('disallow', 'target', octet_length(disallow.target), 4096);
    v_org  bigint := orca._org_named(disallow.org);
    v_rule jsonb;
BEGIN
    PERFORM orca._installation_admin();
    IF disallow.target IS NULL THEN
        RAISE EXCEPTION 'invalid allowlist entry NULL' USING ERRCODE = 'OR093';
    END IF;
    v_rule := orca._unwrap(orca._allow_rule(disallow.target));
    DELETE FROM orca.allowlist a WHERE a.org_id = v_org AND a.target = v_rule->>'target';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'org ''%'' has no allowlist entry %', disallow.org, v_rule->>'target'
            USING ERRCODE = 'OR093', HINT = 'orca.allowlist lists the org''s entries';
    END IF;
    PERFORM orca._event(v_org, 'allowlist.removed', NULL, NULL, NULL,
        jsonb_build_object('target', v_rule->>'target', 'by', session_user));
END
$$;
COMMENT ON FUNCTION orca.disallow(text, text) IS
'Removes an entry of an org''s allowlist (written as orca.allow took it or as stored); the '
'next attempt of each sync is refused what it permitted. Admins only. Errors: OR001, OR093.';

CREATE OR REPLACE FUNCTION orca.create_sync(name text, source jsonb, destination jsonb, streams jsonb,
                                 schedule text DEFAULT NULL, delivery text DEFAULT 'exactly_once',
                                 pool text DEFAULT 'default', run_retries integer DEFAULT 2)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('create_sync', 'name', octet_length(create_sync.name), 1024)
                         AND orca._bound('create_sync', 'source', octet_length(create_sync.source::text), 65536)
                         AND orca._bound('create_sync', 'destination', octet_length(create_sync.destination::text), 65536)
                         AND orca._bound('create_sync', 'streams', octet_length(create_sync.streams::text), 1048576)
                         AND orca._bound('create_sync', 'schedule', octet_length(create_sync.schedule), 1024)
                         AND orca._bound('create_sync', 'delivery', octet_length(create_sync.delivery), 1024)
                         AND orca._bound('create_sync', 'pool', octet_length(create_sync.pool), 1024);
    v_org bigint := orca.current_org_id();
    d     jsonb;
    v_id  bigint;
    v_old jsonb;
    v_streams jsonb := create_sync.streams;
    v_cat orca.catalogs;
    v_catalog_version integer;
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
    -- Streams planned from the sync's catalog (orca.discover).
    v_cat := orca._catalog(v_org, create_sync.name);
    IF jsonb_typeof(v_streams) = 'object' AND v_streams ? 'catalog' THEN
        IF v_cat.version IS NULL THEN
            RAISE EXCEPTION 'sync ''%'' has no catalog to plan its streams from', create_sync.name
                USING ERRCODE = 'OR063',
                      HINT = format('SELECT orca.discover(%L, <source>) first; its run stores the catalog',
                                    create_sync.name);
        END IF;
        v_streams := orca._planned_streams(v_cat, v_streams);
    END IF;
    d := orca._unwrap(orca._sync_check(create_sync.name, create_sync.source,
                                       create_sync.destination, v_streams,
                                       create_sync.schedule, create_sync.delivery));
    IF v_cat.version IS NOT NULL
       AND orca._source_identity(v_cat.source) = orca._source_identity(d->'source') THEN
        v_catalog_version := v_cat.version;
    ELSIF jsonb_typeof(create_sync.streams) = 'object' THEN
        RAISE EXCEPTION 'catalog ''%'' version % was discovered from another source than sync ''%'' reads',
                        create_sync.name, v_cat.version, create_sync.name
            USING ERRCODE = 'OR063',
                  HINT = format('SELECT orca.discover(%L, <this source>) to discover it', create_sync.name);
    END IF;
    -- Netguard, as far as the definition shows it: hosts written as
    -- addresses, sockets and local paths (names are judged when resolved).
    PERFORM orca._unwrap(orca._netguard_definition(
        (SELECT o.name FROM orca.orgs o WHERE o.id = v_org), d, orca._allowlist(v_org)));
    SELECT sy.definition INTO v_old FROM orca.syncs sy
    WHERE sy.org_id = v_org AND sy.name = create_sync.name;
    -- Defining a sync again replaces its definition; its HEAD and generation
    -- stay. A sync dropped under the name left them on its pipeline.
    INSERT INTO orca.syncs AS s (org_id, name, definition, delivery, generation, head_epoch,
                                 catalog_version)
    SELECT v_org, create_sync.name, d, d->>'delivery',
           coalesce(max(p.sync_generation), 0), coalesce(max(p.sync_epoch), 0), v_catalog_version
    FROM orca.pipelines p WHERE p.org_id = v_org AND p.name = create_sync.name
    ON CONFLICT (org_id, name) DO UPDATE SET definition = excluded.definition,
                                             delivery = excluded.delivery,
                                             catalog_version = excluded.catalog_version,
                                             drift = NULL, drift_at = NULL
    RETURNING s.id INTO v_id;
    PERFORM orca._sync_pipeline(v_org, create_sync.name, d, create_sync.schedule,
                                create_sync.pool, create_sync.run_retries);
    UPDATE orca.pipelines p SET paused = false, sync_generation = NULL, sync_epoch = NULL
    WHERE p.org_id = v_org AND p.name = create_sync.name AND p.sync_generation IS NOT NULL;
    -- A continuous sync is one long-lived run. Redefined while it runs, the
    -- run is cancelled (its attempt stops at its next epoch boundary) and a
    -- new one reads the new definition from HEAD. Writer lanes alone are
    -- followed by the running attempt between epochs (orca.sync_lanes).
    IF (d->'source'->>'continuous')::boolean IS TRUE THEN
        IF (v_old #- '{destination,lanes}') IS DISTINCT FROM (d #- '{destination,lanes}') THEN
            PERFORM orca.cancel(x.id) FROM orca.runs x JOIN orca.pipelines p ON p.id = x.pipeline_id
            WHERE p.org_id = v_org AND p.name = create_sync.name AND x.status IN ('queued', 'running');
        END IF;
        PERFORM orca._keep_running(v_org, create_sync.name);
    END IF;
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
'streams may be {"catalog": true} (or a list of tables instead of true, with options such as '
'"mode" for every stream): the streams the newest catalog of the name (orca.discover) plans, '
'which must have been discovered from this source; each attempt then reports how the source '
'drifted from that catalog version (orca.report_drift). '
'Each stream''s delivery level is worked out from the destination''s class, the source''s '
'replay, the write mode and the primary key, and must reach the required level. Errors: '
'OR060 unknown connector, OR061 missing option, OR062 delivery level impossible for a stream, '
'OR063 malformed definition, OR065 a pipeline has the name, OR030/OR031 bad schedule, '
'OR094 netguard refuses a host written as an address, a socket or a local path it names '
'(orca.allowlist). '
'docs/syncs.md lists the connectors. '
'Example: SELECT orca.create_sync(''shop'', ''{"type":"postgres","url":"postgres://db/shop"}'', '
'''{"type":"iceberg","namespace":"raw"}'', ''[{"name":"orders","table":"public.orders",'
'"cursor":"updated_at","primary_key":["id"]}]'');';

REVOKE ALL ON orca.allowlist FROM PUBLIC;
GRANT SELECT ON orca.allowlist TO orca_viewer;
REVOKE ALL ON FUNCTION
    orca._allow_rule(text),
    orca._netguard_definition(text, jsonb, text[]),
    orca._allowlist_for(jsonb),
    orca._allowlist(bigint),
    orca._org_named(text),
    orca.allow(text, text, text),
    orca.disallow(text, text)
FROM PUBLIC;
GRANT EXECUTE ON FUNCTION orca.allow(text, text, text), orca.disallow(text, text) TO orca_admin;

-- What ran before netguard keeps running: each existing sync gets the
-- entries its definition needs as written (its hosts and local paths).
INSERT INTO orca.allowlist (org_id, target, kind, note)
SELECT DISTINCT ON (s.org_id, r->>'target') s.org_id, r->>'target', r->>'kind',
       'added by the upgrade to 0.2.0: sync ' || s.name || ' reached it before netguard'
FROM orca.syncs s,
     unnest(orca._allowlist_for(s.definition)) AS t(target),
     LATERAL (SELECT orca._unwrap(orca._allow_rule(t.target)) AS r) x(r)
ORDER BY s.org_id, r->>'target', s.name
ON CONFLICT (org_id, target) DO NOTHING;
SELECT orca._event(a.org_id, 'allowlist.added', NULL, NULL, NULL,
                   jsonb_build_object('target', a.target, 'kind', a.kind, 'by', a.created_by,
                                      'note', a.note))
FROM orca.allowlist a;

---------------------------------------------------------------------------
-- API keys (sql/security.sql): orca serve acts for each caller with the
-- caller's key; with a key presented, the key alone decides the org
-- (_may_use_org, current_org_id) and whether the session is an admin
-- (_is_admin); installation administration refuses key sessions.
---------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION orca._is_admin() RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF nullif(current_setting('orca.api_key', true), '') IS NOT NULL THEN
        RETURN false;
    END IF;
    RETURN EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = session_user AND r.rolsuper)
        OR pg_catalog.pg_has_role(session_user, 'orca_admin', 'MEMBER');
END
$$;

CREATE OR REPLACE FUNCTION orca._may_use_org(p_org bigint) RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- With an API key (orca serve's callers), the key's org and no other.
    IF nullif(current_setting('orca.api_key', true), '') IS NOT NULL THEN
        RETURN p_org = (orca._api_key()).org_id;
    END IF;
    RETURN EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = session_user AND r.rolsuper)
        OR pg_has_role(session_user, 'orca_admin', 'MEMBER')
        OR EXISTS (
            SELECT 1
            FROM orca.members m
            JOIN pg_roles r ON r.rolname = m.role_name
            WHERE m.org_id = p_org AND pg_has_role(session_user, r.oid, 'MEMBER'));
END
$$;

CREATE OR REPLACE FUNCTION orca.current_org_id() RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_name text := coalesce(nullif(current_setting('orca.org', true), ''), 'default');
    v_id   bigint;
BEGIN
    -- An API key names its org: a session that presents one needs no orca.org.
    IF nullif(current_setting('orca.api_key', true), '') IS NOT NULL
       AND nullif(current_setting('orca.org', true), '') IS NULL THEN
        RETURN (orca._api_key()).org_id;
    END IF;
    SELECT id INTO v_id FROM orca.orgs WHERE name = v_name;
    IF v_id IS NULL THEN
        RAISE EXCEPTION 'unknown org ''%''', v_name
            USING ERRCODE = 'OR001',
                  HINT = 'SET orca.org to an existing org; orca.orgs lists those you belong to';
    END IF;
    IF NOT orca._may_use_org(v_id) THEN
        IF nullif(current_setting('orca.api_key', true), '') IS NOT NULL THEN
            RAISE EXCEPTION 'API key ''%'' is for org ''%'', not ''%''', (orca._api_key()).name,
                            (SELECT o.name FROM orca.orgs o WHERE o.id = (orca._api_key()).org_id),
                            v_name
                USING ERRCODE = 'OR002',
                      HINT = 'leave orca.org unset: the key names its org';
        END IF;
        RAISE EXCEPTION 'role % is not a member of org ''%''', session_user, v_name
            USING ERRCODE = 'OR002',
                  HINT = 'an orca_admin adds members with orca.add_member(org, role)';
    END IF;
    RETURN v_id;
END
$$;

CREATE OR REPLACE FUNCTION orca.create_org(name text) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_bounded boolean := orca._bound('create_org', 'name', octet_length(create_org.name), 1024);
    v_id bigint;
BEGIN
    PERFORM orca._installation_admin();
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

CREATE OR REPLACE FUNCTION orca.add_member(org text, role text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_bounded boolean := orca._bound('add_member', 'org', octet_length(add_member.org), 1024)
                         AND orca._bound('add_member', 'role', octet_length(add_member.role), 1024);
    v_org bigint;
BEGIN
    PERFORM orca._installation_admin();
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

CREATE OR REPLACE FUNCTION orca.remove_member(org text, role text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_bounded boolean := orca._bound('remove_member', 'org', octet_length(remove_member.org), 1024)
                         AND orca._bound('remove_member', 'role', octet_length(remove_member.role), 1024);
    v_org bigint;
BEGIN
    PERFORM orca._installation_admin();
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

CREATE FUNCTION orca._installation_admin() RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF nullif(current_setting('orca.api_key', true), '') IS NOT NULL THEN
        RAISE EXCEPTION 'installation administration takes an orca_admin login, not an API key'
            USING ERRCODE = '42501',
                  HINT = 'an API key acts in its own org only, even with the admin role';
    END IF;
END
$$;

-- API keys: how `orca serve` (the HTTP API and the console) acts for a
-- caller. A key belongs to one org and has one role (viewer, operator,
-- admin); 32 random bytes shown once, stored as their sha256. The server's
-- login presents the caller's key for each request (SET LOCAL orca.api_key)
-- and takes the key's role (SET LOCAL ROLE orca_<role>), so that grants
-- decide what the caller may call and the key alone which org it sees:
-- with a key presented, membership and superuser rights of the login do
-- not count (orca._may_use_org, orca._is_admin).
CREATE TABLE orca.api_keys (
    org_id     bigint NOT NULL REFERENCES orca.orgs (id),
    id         bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    name       text NOT NULL,
    role       text NOT NULL CHECK (role IN ('viewer', 'operator', 'admin')),
    hash       bytea NOT NULL UNIQUE,
    created_at timestamptz NOT NULL DEFAULT now(),
    created_by name NOT NULL DEFAULT session_user,
    revoked_at timestamptz,
    UNIQUE (org_id, name)
);
COMMENT ON TABLE orca.api_keys IS
'API keys (orca.create_api_key): each lets a caller of orca serve act in one org with one role. '
'Only their hashes are stored, and viewers cannot read those.';
ALTER TABLE orca.api_keys ENABLE ROW LEVEL SECURITY;
CREATE POLICY org_scope ON orca.api_keys USING (org_id = (SELECT orca.current_org_id()));
SELECT pg_catalog.pg_extension_config_dump('orca.api_keys', '');
SELECT pg_catalog.pg_extension_config_dump(
    pg_catalog.pg_get_serial_sequence('orca.api_keys', 'id')::regclass, '');

CREATE FUNCTION orca._api_key() RETURNS orca.api_keys
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_key text := nullif(current_setting('orca.api_key', true), '');
    k     orca.api_keys;
BEGIN
    IF v_key IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT * INTO k FROM orca.api_keys x WHERE x.hash = orca._token_hash(v_key);
    IF NOT FOUND THEN
        RAISE EXCEPTION 'API key refused: it is not a key of this installation'
            USING ERRCODE = 'OR087',
                  HINT = 'an operator creates one with orca.create_api_key(name, role)';
    END IF;
    IF k.revoked_at IS NOT NULL THEN
        RAISE EXCEPTION 'API key ''%'' was revoked at %', k.name, k.revoked_at
            USING ERRCODE = 'OR087';
    END IF;
    RETURN k;
END
$$;

CREATE FUNCTION orca.create_api_key(name text, role text DEFAULT 'viewer') RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('create_api_key', 'name', octet_length(create_api_key.name), 1024)
                         AND orca._bound('create_api_key', 'role', octet_length(create_api_key.role), 1024);
    v_org bigint := orca.current_org_id();
    v_key text := 'orca_ak_' || substr(orca._new_token(), 9);
    v_id  bigint;
BEGIN
    IF create_api_key.name IS NULL
       OR create_api_key.name !~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$' THEN
        RAISE EXCEPTION 'invalid API key name %', quote_nullable(create_api_key.name)
            USING ERRCODE = 'OR050',
                  HINT = 'use 1 to 128 letters, digits, ''_'', ''.'' or ''-''';
    END IF;
    IF create_api_key.role IS NULL OR create_api_key.role NOT IN ('viewer', 'operator', 'admin') THEN
        RAISE EXCEPTION 'an API key''s role is viewer, operator or admin, not %',
                        quote_nullable(create_api_key.role)
            USING ERRCODE = 'OR050';
    END IF;
    IF create_api_key.role = 'admin' AND NOT orca._is_org_admin() THEN
        RAISE EXCEPTION 'only admins create admin API keys' USING ERRCODE = '42501';
    END IF;
    INSERT INTO orca.api_keys AS k (org_id, name, role, hash)
    VALUES (v_org, create_api_key.name, create_api_key.role, orca._token_hash(v_key))
    ON CONFLICT (org_id, name) DO NOTHING
    RETURNING k.id INTO v_id;
    IF v_id IS NULL THEN
        RAISE EXCEPTION 'API key ''%'' already exists', create_api_key.name
            USING ERRCODE = 'OR050',
                  HINT = 'revoke it (orca.revoke_api_key) and create one under another name';
    END IF;
    PERFORM orca._event(v_org, 'api_key.created', NULL, NULL, NULL,
        jsonb_build_object('name', create_api_key.name, 'role', create_api_key.role,
                           'by', session_user));
    RETURN v_key;
END
$$;
COMMENT ON FUNCTION orca.create_api_key(text, text) IS
'Creates an API key of the session''s org with a role (viewer, operator, admin) and returns '
'it: shown this once, stored only as its sha256. orca serve''s callers send it as '
'Authorization: Bearer <key>; the key decides the org and the role, whatever the server''s '
'login. Operators create viewer and operator keys, admins admin keys too. '
'Example: SELECT orca.create_api_key(''dashboard'', ''viewer'');';

CREATE FUNCTION orca.revoke_api_key(name text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('revoke_api_key', 'name', octet_length(revoke_api_key.name), 1024);
    v_org bigint := orca.current_org_id();
    k     orca.api_keys;
BEGIN
    UPDATE orca.api_keys x SET revoked_at = coalesce(x.revoked_at, now())
    WHERE x.org_id = v_org AND x.name = revoke_api_key.name
    RETURNING * INTO k;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown API key %', quote_nullable(revoke_api_key.name)
            USING ERRCODE = 'OR088', HINT = 'orca.api_keys lists the keys of the org';
    END IF;
    PERFORM orca._event(v_org, 'api_key.revoked', NULL, NULL, NULL,
        jsonb_build_object('name', k.name, 'role', k.role, 'by', session_user));
END
$$;
COMMENT ON FUNCTION orca.revoke_api_key(text) IS
'Revokes an API key of the session''s org: its next request is refused (OR087). Operators and '
'admins. OR088 for an unknown name.';

CREATE FUNCTION orca.api_session() RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    k orca.api_keys := orca._api_key();
BEGIN
    IF k.id IS NULL THEN
        RAISE EXCEPTION 'no API key: set orca.api_key to the caller''s key'
            USING ERRCODE = 'OR087';
    END IF;
    RETURN jsonb_build_object('org', (SELECT o.name FROM orca.orgs o WHERE o.id = k.org_id),
                              'role', k.role, 'key', k.name);
END
$$;
COMMENT ON FUNCTION orca.api_session() IS
'The org, role and name of the API key the session presents (SET orca.api_key): what orca '
'serve asks before it takes the key''s role (SET LOCAL ROLE orca_<role>) for a request. '
'OR087 for no key, an unknown or a revoked one.';

REVOKE ALL ON orca.api_keys FROM PUBLIC;
REVOKE ALL ON SEQUENCE orca.api_keys_id_seq FROM PUBLIC;
GRANT SELECT (org_id, id, name, role, created_at, created_by, revoked_at)
    ON orca.api_keys TO orca_viewer;
REVOKE ALL ON FUNCTION
    orca._installation_admin(),
    orca._api_key(),
    orca.create_api_key(text, text),
    orca.revoke_api_key(text),
    orca.api_session()
FROM PUBLIC;
GRANT EXECUTE ON FUNCTION orca.api_session() TO orca_viewer;
GRANT EXECUTE ON FUNCTION orca.create_api_key(text, text), orca.revoke_api_key(text)
    TO orca_operator;

---------------------------------------------------------------------------
-- Webhooks (sql/webhooks.sql): endpoints with a cursor into the outbox,
-- delivered by relays (orca_relay), signed per the Standard Webhooks spec.
---------------------------------------------------------------------------

CREATE  FUNCTION "_webhook_check"(
	"org" TEXT, /* & str */
	"url" TEXT, /* Option < & str > */
	"events" TEXT[], /* :: std :: option :: Option < Vec < String > > */
	"allowlist" TEXT[] /* Vec < String > */
) RETURNS jsonb /* JsonB */
IMMUTABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'webhook_check_wrapper';

CREATE  FUNCTION "_webhook_backoff_max"() RETURNS INT /* i32 */
STRICT STABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'webhook_backoff_max_wrapper';

CREATE  FUNCTION "_webhook_disable_after"() RETURNS INT /* i32 */
STRICT STABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'webhook_disable_after_wrapper';

-- Relays log in with a role in orca_relay: they deliver every org's
-- endpoints, and may call nothing else. Group roles are cluster-wide.
DO $relay$
BEGIN
    -- A database installing at the same moment may make it first: the role
    -- then exists, which is what this wanted (schema.sql says more).
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'orca_relay') THEN
        BEGIN
            CREATE ROLE orca_relay NOLOGIN;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;
        END;
    END IF;
    IF NOT pg_catalog.pg_has_role('orca_admin', 'orca_relay', 'MEMBER') THEN
        BEGIN
            GRANT orca_relay TO orca_admin;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;
        END;
    END IF;
END
$relay$;

CREATE TABLE orca.webhooks (
    org_id          bigint NOT NULL REFERENCES orca.orgs (id),
    id              bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    url             text NOT NULL,
    -- Event kinds ('run.failed'), families ('run.*') or everything ('*').
    events          text[] NOT NULL,
    description     text,
    -- The signing secret (whsec_...), sealed by the org's data key like a
    -- secret (orca.set_secret); the relay opens it to sign.
    secret_sealed   bytea NOT NULL,
    -- The last event delivered, or passed over as not wanted.
    cursor          bigint NOT NULL DEFAULT 0,
    enabled         boolean NOT NULL DEFAULT true,
    disabled_reason text,
    -- Since when deliveries fail without one succeeding, and the failed
    -- tries of the event at the cursor.
    failing_since   timestamptz,
    failures        integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    created_at      timestamptz NOT NULL DEFAULT now(),
    created_by      name NOT NULL DEFAULT session_user,
    rotated_at      timestamptz
);
CREATE INDEX webhooks_due ON orca.webhooks (next_attempt_at) WHERE enabled;
COMMENT ON TABLE orca.webhooks IS
'Webhook endpoints (orca.create_webhook): the org''s events matching events[] are delivered to '
'url, signed with the endpoint''s secret, in order, at least once. Viewers see everything but '
'the secret.';

CREATE TABLE orca.webhook_deliveries (
    org_id      bigint NOT NULL REFERENCES orca.orgs (id),
    id          bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    webhook_id  bigint NOT NULL REFERENCES orca.webhooks (id) ON DELETE CASCADE,
    event_id    bigint NOT NULL,
    -- 1 for the first try of this event at this endpoint.
    attempt     integer NOT NULL,
    status      text NOT NULL CHECK (status IN ('delivered', 'failed')),
    -- The endpoint's HTTP status, if it answered.
    response    integer,
    latency_ms  integer NOT NULL,
    error       text,
    relay       text,
    at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX webhook_deliveries_by_webhook ON orca.webhook_deliveries (webhook_id, id);
COMMENT ON TABLE orca.webhook_deliveries IS
'Every try of a webhook delivery: the event, the endpoint''s answer and how long it took.';

DO $webhooks$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['webhooks', 'webhook_deliveries'] LOOP
        EXECUTE format('ALTER TABLE orca.%I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('CREATE POLICY org_scope ON orca.%I USING (org_id = (SELECT orca.current_org_id()))', t);
        PERFORM pg_catalog.pg_extension_config_dump(('orca.' || t)::regclass, '');
        PERFORM pg_catalog.pg_extension_config_dump(
            pg_catalog.pg_get_serial_sequence('orca.' || t, 'id')::regclass, '');
    END LOOP;
END
$webhooks$;

-- A new signing secret: whsec_ and 32 random bytes in base64, as the
-- Standard Webhooks libraries take it.
CREATE FUNCTION orca._new_webhook_secret() RETURNS text
LANGUAGE sql VOLATILE AS $$
    SELECT 'whsec_' || pg_catalog.encode(pg_catalog.sha256(
               pg_catalog.uuid_send(pg_catalog.gen_random_uuid())
               || pg_catalog.uuid_send(pg_catalog.gen_random_uuid())
               || pg_catalog.uuid_send(pg_catalog.gen_random_uuid())), 'base64')
$$;

CREATE FUNCTION orca._seal_webhook_secret(p_org bigint, p_id bigint, p_secret text) RETURNS bytea
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN pg_catalog.decode(orca._unwrap(orca._seal_secret(orca._org_data_key(p_org), p_org,
                                                            'webhook.' || p_id, p_secret)) #>> '{}',
                             'hex');
END
$$;

-- Whether an event kind is one an endpoint asked for.
CREATE FUNCTION orca._webhook_wants(p_events text[], p_kind text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT EXISTS (SELECT 1 FROM unnest(p_events) e
                   WHERE e = '*' OR e = p_kind
                      OR (right(e, 2) = '.*' AND p_kind LIKE left(e, -1) || '%'))
$$;

CREATE FUNCTION orca._webhook(p_org bigint, p_id bigint) RETURNS orca.webhooks
LANGUAGE plpgsql AS $$
DECLARE
    w orca.webhooks;
BEGIN
    SELECT * INTO w FROM orca.webhooks x WHERE x.org_id = p_org AND x.id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown webhook %', coalesce(p_id::text, 'NULL')
            USING ERRCODE = 'OR096', HINT = 'orca.webhooks lists the org''s endpoints';
    END IF;
    RETURN w;
END
$$;

CREATE FUNCTION orca.create_webhook(url text, events text[], description text DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('create_webhook', 'url', octet_length(create_webhook.url), 4096)
                         AND orca._bound('create_webhook', 'events', octet_length(array_to_string(create_webhook.events, '', '')) + cardinality(create_webhook.events), 65536)
                         AND orca._bound('create_webhook', 'description', octet_length(create_webhook.description), 4096);
    v_org    bigint := orca.current_org_id();
    v_secret text := orca._new_webhook_secret();
    v_id     bigint;
BEGIN
    PERFORM orca._unwrap(orca._webhook_check(
        (SELECT o.name FROM orca.orgs o WHERE o.id = v_org), create_webhook.url,
        create_webhook.events, orca._allowlist(v_org)));
    INSERT INTO orca.webhooks AS w (org_id, url, events, description, secret_sealed, cursor)
    VALUES (v_org, create_webhook.url, create_webhook.events, create_webhook.description, '\x',
            -- From now on: an endpoint gets the events after its creation.
            coalesce((SELECT max(e.id) FROM orca.events e), 0))
    RETURNING w.id INTO v_id;
    UPDATE orca.webhooks SET secret_sealed = orca._seal_webhook_secret(v_org, v_id, v_secret)
    WHERE id = v_id;
    PERFORM orca._event(v_org, 'webhook.created', NULL, NULL, NULL,
        jsonb_build_object('webhook', v_id, 'url', create_webhook.url,
                           'events', to_jsonb(create_webhook.events), 'by', session_user));
    RETURN jsonb_build_object('id', v_id, 'secret', v_secret);
END
$$;
COMMENT ON FUNCTION orca.create_webhook(text, text[], text) IS
'Delivers the org''s events whose kind matches events (''run.failed'', ''run.*'', ''*'') to '
'url (http or https, through netguard) from now on, signed per the Standard Webhooks spec; '
'returns {id, secret}: the signing secret (whsec_...) is shown this once. Operators and admins. '
'Errors: OR095 bad URL or event list, OR094 netguard refuses the host, OR090 secrets not set up. '
'Example: SELECT orca.create_webhook(''https://hooks.example.com/orca'', ''{run.failed}'');';

CREATE FUNCTION orca.rotate_webhook_secret(webhook bigint) RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_org    bigint := orca.current_org_id();
    w        orca.webhooks := orca._webhook(v_org, rotate_webhook_secret.webhook);
    v_secret text := orca._new_webhook_secret();
BEGIN
    UPDATE orca.webhooks SET secret_sealed = orca._seal_webhook_secret(v_org, w.id, v_secret),
                             rotated_at = now()
    WHERE id = w.id;
    PERFORM orca._event(v_org, 'webhook.rotated', NULL, NULL, NULL,
        jsonb_build_object('webhook', w.id, 'by', session_user));
    RETURN v_secret;
END
$$;
COMMENT ON FUNCTION orca.rotate_webhook_secret(bigint) IS
'Gives an endpoint a new signing secret and returns it (shown this once); deliveries from the '
'next one on are signed with it. Operators and admins. OR096 for an unknown webhook.';

CREATE FUNCTION orca.set_webhook_enabled(webhook bigint, enabled boolean) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_org bigint := orca.current_org_id();
    w     orca.webhooks := orca._webhook(v_org, set_webhook_enabled.webhook);
BEGIN
    UPDATE orca.webhooks
    SET enabled = coalesce(set_webhook_enabled.enabled, false),
        disabled_reason = CASE WHEN set_webhook_enabled.enabled THEN NULL ELSE 'disabled by ' || session_user END,
        failing_since = NULL, failures = 0, next_attempt_at = now()
    WHERE id = w.id;
    PERFORM orca._event(v_org, CASE WHEN set_webhook_enabled.enabled THEN 'webhook.enabled'
                                    ELSE 'webhook.disabled' END, NULL, NULL, NULL,
        jsonb_build_object('webhook', w.id, 'by', session_user));
END
$$;
COMMENT ON FUNCTION orca.set_webhook_enabled(bigint, boolean) IS
'Disables an endpoint, or enables it again (it goes on from its cursor: nothing is lost while '
'it was off). Operators and admins. OR096 for an unknown webhook.';

CREATE FUNCTION orca.drop_webhook(webhook bigint) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_org bigint := orca.current_org_id();
    w     orca.webhooks := orca._webhook(v_org, drop_webhook.webhook);
BEGIN
    DELETE FROM orca.webhooks WHERE id = w.id;
    PERFORM orca._event(v_org, 'webhook.dropped', NULL, NULL, NULL,
        jsonb_build_object('webhook', w.id, 'url', w.url, 'by', session_user));
END
$$;
COMMENT ON FUNCTION orca.drop_webhook(bigint) IS
'Drops an endpoint and its delivery history. Operators and admins. OR096 for an unknown webhook.';

-- The relay's side. A relay's login is in orca_relay; these functions act
-- across orgs (each endpoint in its own org) and only for relays.

-- Takes one due endpoint (locked for the rest of the relay's transaction,
-- skipped by every other relay), with its opened secret, its org's netguard
-- allowlist, and up to p_max of the events after its cursor that it wants.
-- Events it does not want are passed over by moving its cursor.
CREATE FUNCTION orca.relay_take(p_max integer DEFAULT 20) RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    w       orca.webhooks;
    v_evts  jsonb;
    v_last  bigint;
    v_skip  bigint;
BEGIN
    -- A relay delivers for every org: an org's API key (whatever its role,
    -- and orca_admin includes orca_relay) never takes another org's
    -- endpoint and its signing secret.
    PERFORM orca._installation_admin();
    LOOP
        SELECT * INTO w FROM orca.webhooks x
        WHERE x.enabled AND x.next_attempt_at <= now()
          AND EXISTS (SELECT 1 FROM orca.events e WHERE e.org_id = x.org_id AND e.id > x.cursor)
        ORDER BY x.next_attempt_at, x.id
        LIMIT 1
        FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
        SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'id', e.id, 'kind', e.kind, 'at', e.at,
                   'pipeline', (SELECT p.name FROM orca.pipelines p WHERE p.id = e.pipeline_id),
                   'run', e.run_id, 'attempt', e.attempt_id, 'data', e.data) ORDER BY e.id), '[]'),
               max(e.id)
        INTO v_evts, v_last
        FROM (SELECT * FROM orca.events e
              WHERE e.org_id = w.org_id AND e.id > w.cursor
                AND orca._webhook_wants(w.events, e.kind)
              ORDER BY e.id LIMIT greatest(1, least(coalesce(p_max, 20), 500))) e;
        IF v_last IS NOT NULL THEN
            -- Pass over what it does not want up to its first wanted event.
            UPDATE orca.webhooks SET cursor = greatest(cursor, (
                SELECT min(e.id) - 1 FROM orca.events e
                WHERE e.org_id = w.org_id AND e.id > w.cursor AND orca._webhook_wants(w.events, e.kind)))
            WHERE id = w.id;
            RETURN jsonb_build_object(
                'webhook', w.id,
                'org', (SELECT o.name FROM orca.orgs o WHERE o.id = w.org_id),
                'url', w.url,
                'secret', orca._unwrap(orca._open_secret(orca._org_data_key(w.org_id), w.org_id,
                                                         'webhook.' || w.id, w.secret_sealed)) #>> '{}',
                'allowlist', to_jsonb(orca._allowlist(w.org_id)),
                'attempt', w.failures + 1,
                'events', v_evts);
        END IF;
        -- Nothing it wants: move its cursor past what there is, and look on.
        SELECT max(e.id) INTO v_skip FROM orca.events e WHERE e.org_id = w.org_id;
        UPDATE orca.webhooks SET cursor = greatest(cursor, coalesce(v_skip, cursor)) WHERE id = w.id;
    END LOOP;
END
$$;
COMMENT ON FUNCTION orca.relay_take(integer) IS
'For relays (orca_relay logins, never an API key): takes one due webhook endpoint, locked '
'until the caller''s '
'transaction ends and skipped by other relays, and returns its URL, opened signing secret, '
'netguard allowlist and the next events (up to p_max) it wants; NULL when none is due.';

-- Records a delivery's outcome in the transaction that took the endpoint:
-- delivered moves the cursor past the event; failed keeps it there and
-- backs off (exponentially, with jitter), disabling the endpoint with an
-- event once it has failed for orca.webhook_disable_after.
CREATE FUNCTION orca.relay_done(p_webhook bigint, p_event bigint, p_delivered boolean,
                                p_response integer, p_latency_ms integer, p_error text,
                                p_relay text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_bounded boolean := orca._bound('relay_done', 'p_error', octet_length(relay_done.p_error), 65536)
                         AND orca._bound('relay_done', 'p_relay', octet_length(relay_done.p_relay), 1024);
    w       orca.webhooks;
    v_delay double precision;
BEGIN
    PERFORM orca._installation_admin();
    SELECT * INTO w FROM orca.webhooks WHERE id = p_webhook FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    INSERT INTO orca.webhook_deliveries (org_id, webhook_id, event_id, attempt, status, response,
                                         latency_ms, error, relay)
    VALUES (w.org_id, w.id, p_event, w.failures + 1,
            CASE WHEN p_delivered THEN 'delivered' ELSE 'failed' END, p_response,
            greatest(0, coalesce(p_latency_ms, 0)), left(p_error, 2000), p_relay);
    IF p_delivered THEN
        UPDATE orca.webhooks SET cursor = greatest(cursor, p_event), failures = 0,
                                 failing_since = NULL, next_attempt_at = now()
        WHERE id = w.id;
        RETURN;
    END IF;
    -- 1 s, 2 s, 4 s ... up to orca.webhook_backoff_max_seconds, each within
    -- 50-150 % so that endpoints that failed together do not come back together.
    v_delay := least(power(2, least(w.failures, 30)), orca._webhook_backoff_max())
               * (0.5 + random());
    UPDATE orca.webhooks
    SET failures = failures + 1,
        failing_since = coalesce(failing_since, now()),
        next_attempt_at = now() + make_interval(secs => v_delay)
    WHERE id = w.id
    RETURNING * INTO w;
    IF w.failing_since < now() - make_interval(secs => orca._webhook_disable_after()) THEN
        UPDATE orca.webhooks
        SET enabled = false,
            disabled_reason = format('failing since %s (last: %s)', w.failing_since,
                                     coalesce(p_response::text, p_error, 'no answer'))
        WHERE id = w.id;
        PERFORM orca._event(w.org_id, 'webhook.disabled', NULL, NULL, NULL,
            jsonb_build_object('webhook', w.id, 'url', w.url, 'failing_since', w.failing_since,
                               'last_response', p_response, 'last_error', p_error));
    END IF;
END
$$;
COMMENT ON FUNCTION orca.relay_done(bigint, bigint, boolean, integer, integer, text, text) IS
'For relays (orca_relay): records one delivery try of an event at an endpoint taken with '
'orca.relay_take. Delivered moves the endpoint''s cursor past it; failed backs off '
'(exponentially, with jitter) and disables the endpoint once it has failed for '
'orca.webhook_disable_after seconds.';

REVOKE ALL ON orca.webhooks, orca.webhook_deliveries FROM PUBLIC;
REVOKE ALL ON SEQUENCE orca.webhooks_id_seq, orca.webhook_deliveries_id_seq FROM PUBLIC;
GRANT SELECT (org_id, id, url, events, description, cursor, enabled, disabled_reason,
              failing_since, failures, next_attempt_at, created_at, created_by, rotated_at)
    ON orca.webhooks TO orca_viewer;
GRANT SELECT ON orca.webhook_deliveries TO orca_viewer;
GRANT USAGE ON SCHEMA orca TO orca_relay;
REVOKE ALL ON FUNCTION
    orca._webhook_check(text, text, text[], text[]),
    orca._webhook_backoff_max(),
    orca._webhook_disable_after(),
    orca._new_webhook_secret(),
    orca._seal_webhook_secret(bigint, bigint, text),
    orca._webhook_wants(text[], text),
    orca._webhook(bigint, bigint),
    orca.create_webhook(text, text[], text),
    orca.rotate_webhook_secret(bigint),
    orca.set_webhook_enabled(bigint, boolean),
    orca.drop_webhook(bigint),
    orca.relay_take(integer),
    orca.relay_done(bigint, bigint, boolean, integer, integer, text, text)
FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    orca.create_webhook(text, text[], text),
    orca.rotate_webhook_secret(bigint),
    orca.set_webhook_enabled(bigint, boolean),
    orca.drop_webhook(bigint)
    TO orca_operator;
GRANT EXECUTE ON FUNCTION
    orca.relay_take(integer),
    orca.relay_done(bigint, bigint, boolean, integer, integer, text, text)
    TO orca_relay;

---------------------------------------------------------------------------
-- Retention and metrics: orca.tick prunes history older than the
-- orca.retain_* settings in bounded batches; orca.metrics() for /metrics.
---------------------------------------------------------------------------

CREATE  FUNCTION "_retain_seconds"(
	"what" TEXT /* & str */
) RETURNS INT /* i32 */
STRICT STABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'retain_seconds_wrapper';

CREATE  FUNCTION "_retention_batch"() RETURNS INT /* i32 */
STRICT STABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'retention_batch_wrapper';

CREATE TABLE orca.counters (
    org_id bigint NOT NULL REFERENCES orca.orgs (id),
    name   text NOT NULL,
    value  bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (org_id, name)
);
COMMENT ON TABLE orca.counters IS
'Monotonic counters per org (leases_lapsed, pruned_runs, pruned_events, ...), which '
'orca.metrics() reports; they survive the pruning of the rows they count.';
ALTER TABLE orca.counters ENABLE ROW LEVEL SECURITY;
CREATE POLICY org_scope ON orca.counters USING (org_id = (SELECT orca.current_org_id()));
SELECT pg_catalog.pg_extension_config_dump('orca.counters', '');

CREATE FUNCTION orca._count(p_org bigint, p_name text, p_by bigint DEFAULT 1) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(p_by, 0) <> 0 THEN
        INSERT INTO orca.counters AS c (org_id, name, value) VALUES (p_org, p_name, p_by)
        ON CONFLICT (org_id, name) DO UPDATE SET value = c.value + excluded.value;
    END IF;
END
$$;

CREATE INDEX runs_finished ON orca.runs (finished_at) WHERE finished_at IS NOT NULL;

CREATE FUNCTION orca.retention()
RETURNS TABLE (what text, setting text, keep_seconds integer, keeps text)
LANGUAGE sql STABLE AS $$
    SELECT x.what, x.setting, orca._retain_seconds(x.what),
           CASE WHEN orca._retain_seconds(x.what) = 0 THEN 'forever'
                ELSE make_interval(secs => orca._retain_seconds(x.what))::text END
    FROM (VALUES ('runs', 'orca.retain_runs'), ('events', 'orca.retain_events'),
                 ('webhook_deliveries', 'orca.retain_webhook_deliveries'),
                 ('runners', 'orca.retain_runners')) AS x(what, setting)
$$;
COMMENT ON FUNCTION orca.retention() IS
'How long orca.tick keeps finished runs (with their attempts, step states, reads and commits), '
'events, webhook delivery rows and runners not seen since, from the orca.retain_* settings '
'(0: forever); orca.retention_batch bounds the rows pruned per table per tick. '
'Example: SELECT * FROM orca.retention();';

CREATE FUNCTION orca._tick_prune(p_orgs bigint[], p_now timestamptz) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_batch    integer := orca._retention_batch();
    v_keep     integer;
    v_cut      timestamptz;
    v_protect  bigint;
    n_runs     integer := 0;
    n_events   integer := 0;
    n_del      integer := 0;
    n_runners  integer := 0;
    v_org      bigint;
    v_share    integer;
    v_n        integer;
    c          record;
BEGIN
    v_keep := orca._retain_seconds('runs');
    IF v_keep > 0 THEN
        v_cut := p_now - make_interval(secs => v_keep);
        FOR c IN
            WITH gone AS (
                DELETE FROM orca.runs d
                WHERE d.id IN (
                    SELECT r.id FROM orca.runs r
                    WHERE r.finished_at IS NOT NULL AND r.finished_at < v_cut
                      AND r.org_id = ANY (p_orgs)
                      AND r.status IN ('succeeded', 'failed', 'cancelled')
                      AND NOT EXISTS (
                          SELECT 1 FROM orca.sensors s
                          JOIN orca.commits cm ON cm.run_id = r.id AND cm.id > s.commit_cursor
                          WHERE s.org_id = r.org_id)
                      AND NOT EXISTS (
                          SELECT 1 FROM orca.pipeline_versions rv
                          JOIN orca.pipelines p ON p.id = r.pipeline_id
                          JOIN orca.pipeline_versions cv ON cv.id = p.current_version
                          WHERE rv.id = r.version_id AND r.kind = 'pipeline'
                            AND cv.partition_kind = 'keyed'
                            AND rv.registry_hash = cv.registry_hash)
                    ORDER BY r.finished_at
                    LIMIT v_batch)
                RETURNING d.org_id)
            SELECT org_id, count(*) AS n FROM gone GROUP BY org_id
        LOOP
            PERFORM orca._count(c.org_id, 'pruned_runs', c.n);
            n_runs := n_runs + c.n;
        END LOOP;
    END IF;

    -- A sync's epochs go with the runs' window (the checkpoint log keeps
    -- its records; these are their figures).
    IF v_keep > 0 THEN
        DELETE FROM orca.sync_epochs d
        WHERE (d.sync_id, d.epoch) IN (
            SELECT x.sync_id, x.epoch FROM orca.sync_epochs x
            WHERE x.committed_at < v_cut AND x.org_id = ANY (p_orgs)
            ORDER BY x.committed_at LIMIT v_batch);
    END IF;

    -- Events, org by org: an enabled endpoint's cursor holds back the
    -- pruning of its own org's events (not delivered yet), never another
    -- org's. Each org is read from its oldest event (events_org), and each
    -- gets its share of the batch, so that one org's backlog does not keep
    -- the others' waiting.
    v_keep := orca._retain_seconds('events');
    IF v_keep > 0 THEN
        v_cut := p_now - make_interval(secs => v_keep);
        v_share := greatest((v_batch + cardinality(p_orgs) - 1) / greatest(cardinality(p_orgs), 1), 1);
        FOREACH v_org IN ARRAY p_orgs LOOP
            CONTINUE WHEN NOT coalesce((SELECT e.at < v_cut FROM orca.events e
                                        WHERE e.org_id = v_org ORDER BY e.id LIMIT 1), false);
            SELECT min(w.cursor) INTO v_protect FROM orca.webhooks w
            WHERE w.org_id = v_org AND w.enabled;
            WITH gone AS (
                DELETE FROM orca.events d
                WHERE d.id IN (SELECT e.id FROM orca.events e
                               WHERE e.org_id = v_org AND e.id <= coalesce(v_protect, e.id)
                               ORDER BY e.id LIMIT v_share)
                  AND d.at < v_cut
                RETURNING 1)
            SELECT count(*) INTO v_n FROM gone;
            IF v_n > 0 THEN
                PERFORM orca._count(v_org, 'pruned_events', v_n);
                n_events := n_events + v_n;
            END IF;
        END LOOP;
    END IF;

    v_keep := orca._retain_seconds('webhook_deliveries');
    IF v_keep > 0 THEN
        v_cut := p_now - make_interval(secs => v_keep);
        WITH gone AS (
            DELETE FROM orca.webhook_deliveries d
            WHERE d.id IN (SELECT x.id FROM orca.webhook_deliveries x
                           WHERE x.org_id = ANY (p_orgs) ORDER BY x.id LIMIT v_batch)
              AND d.at < v_cut
            RETURNING 1)
        SELECT count(*) INTO n_del FROM gone;
    END IF;

    v_keep := orca._retain_seconds('runners');
    IF v_keep > 0 THEN
        v_cut := p_now - make_interval(secs => v_keep);
        WITH gone AS (
            DELETE FROM orca.runners d
            WHERE (d.org_id, d.name) IN (
                SELECT x.org_id, x.name FROM orca.runners x
                WHERE x.last_seen < v_cut AND x.org_id = ANY (p_orgs)
                  AND NOT EXISTS (SELECT 1 FROM orca.leases l
                                  WHERE l.org_id = x.org_id AND l.runner = x.name)
                LIMIT v_batch)
            RETURNING 1)
        SELECT count(*) INTO n_runners FROM gone;
    END IF;

    IF n_runs + n_events + n_del + n_runners = 0 THEN
        RETURN '{}';
    END IF;
    RETURN jsonb_build_object('pruned', jsonb_build_object(
        'runs', n_runs, 'events', n_events, 'webhook_deliveries', n_del, 'runners', n_runners));
END
$$;

CREATE FUNCTION orca.metrics()
RETURNS TABLE (metric text, kind text, help text, labels jsonb, value double precision)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_org bigint := orca.current_org_id();
BEGIN
    RETURN QUERY
    SELECT 'orca_runs', 'gauge', 'Runs kept (see orca.retention()) by pipeline, kind and status.',
           jsonb_build_object('pipeline', p.name, 'kind', r.kind, 'status', r.status),
           count(*)::double precision
    FROM orca.runs r JOIN orca.pipelines p ON p.id = r.pipeline_id
    WHERE r.org_id = v_org
    GROUP BY p.name, r.kind, r.status;

    RETURN QUERY
    WITH pools AS (
        SELECT q.pool, count(*) AS n, min(q.attempt_id) AS oldest
        FROM orca.queue q WHERE q.org_id = v_org GROUP BY q.pool
    ), m AS (
        SELECT 'orca_queue_depth' AS metric, 'Attempts waiting for a runner, by pool.' AS help,
               pools.pool, pools.n::double precision AS value
        FROM pools
        UNION ALL
        SELECT 'orca_queue_oldest_seconds', 'Age of the oldest attempt waiting for a runner, by pool.',
               pools.pool,
               greatest(0, extract(epoch FROM now() - a.created_at))::double precision
        FROM pools JOIN orca.attempts a ON a.id = pools.oldest
    )
    SELECT m.metric, 'gauge', m.help, jsonb_build_object('pool', m.pool), m.value FROM m;

    RETURN QUERY
    SELECT 'orca_leases', 'gauge', 'Attempts leased to runners now, by pool.',
           jsonb_build_object('pool', a.pool), count(*)::double precision
    FROM orca.leases l JOIN orca.attempts a ON a.id = l.attempt_id
    WHERE l.org_id = v_org
    GROUP BY a.pool;

    RETURN QUERY
    SELECT 'orca_queued_runs', 'gauge', 'Runs waiting to start (within max_runs), by pipeline.',
           jsonb_build_object('pipeline', p.name), count(*)::double precision
    FROM orca.runs r JOIN orca.pipelines p ON p.id = r.pipeline_id
    WHERE r.org_id = v_org AND r.status = 'queued'
    GROUP BY p.name;

    RETURN QUERY
    SELECT 'orca_' || c.name || '_total', 'counter',
           CASE c.name
               WHEN 'leases_lapsed' THEN 'Leases that passed their deadline without a heartbeat.'
               ELSE 'Rows orca.tick pruned (' || replace(c.name, 'pruned_', '') || ').'
           END,
           '{}'::jsonb, c.value::double precision
    FROM orca.counters c WHERE c.org_id = v_org;

    RETURN QUERY
    SELECT 'orca_runners', 'gauge', 'Runners seen in the last five minutes, by pool.',
           jsonb_build_object('pool', x.pool), count(*)::double precision
    FROM orca.runners x
    WHERE x.org_id = v_org AND x.last_seen > now() - interval '5 minutes'
    GROUP BY x.pool;

    RETURN QUERY
    SELECT 'orca_runner_slots', 'gauge', 'Slots of the runners seen in the last five minutes, by pool.',
           jsonb_build_object('pool', x.pool), coalesce(sum(x.slots), 0)::double precision
    FROM orca.runners x
    WHERE x.org_id = v_org AND x.last_seen > now() - interval '5 minutes'
    GROUP BY x.pool;

    RETURN QUERY
    SELECT 'orca_runner_last_seen_seconds', 'gauge', 'Seconds since each runner last claimed or heartbeat.',
           jsonb_build_object('runner', x.name, 'pool', x.pool),
           greatest(0, extract(epoch FROM now() - x.last_seen))::double precision
    FROM orca.runners x WHERE x.org_id = v_org;

    RETURN QUERY
    SELECT m.metric, 'gauge', m.help, jsonb_build_object('sync', s.name), m.value
    FROM orca.syncs s
    CROSS JOIN LATERAL (VALUES
        ('orca_sync_head_epoch', 'The last epoch the sync committed (its HEAD).',
         s.head_epoch::double precision),
        ('orca_sync_head_age_seconds', 'Seconds since the sync''s HEAD last moved.',
         CASE WHEN s.head_at IS NULL THEN NULL
              ELSE greatest(0, extract(epoch FROM now() - s.head_at))::double precision END)
    ) AS m(metric, help, value)
    WHERE s.org_id = v_org AND m.value IS NOT NULL;

    RETURN QUERY
    SELECT 'orca_webhook_backlog', 'gauge',
           'Events after an enabled webhook endpoint''s cursor (counted up to 100000).',
           jsonb_build_object('webhook', w.id::text),
           (SELECT count(*) FROM (SELECT 1 FROM orca.events e
                                  WHERE e.org_id = w.org_id AND e.id > w.cursor
                                  LIMIT 100000) b)::double precision
    FROM orca.webhooks w WHERE w.org_id = v_org AND w.enabled;

    RETURN QUERY
    SELECT 'orca_webhook_deliveries', 'gauge',
           'Delivery tries kept (orca.retain_webhook_deliveries), by endpoint and status.',
           jsonb_build_object('webhook', d.webhook_id::text, 'status', d.status),
           count(*)::double precision
    FROM orca.webhook_deliveries d WHERE d.org_id = v_org
    GROUP BY d.webhook_id, d.status;

    RETURN QUERY
    SELECT 'orca_webhooks_disabled', 'gauge', 'Webhook endpoints that are disabled.',
           '{}'::jsonb, count(*)::double precision
    FROM orca.webhooks w WHERE w.org_id = v_org AND NOT w.enabled;

    -- The scheduler's ticks, from PostgreSQL's function statistics: the
    -- background worker tracks its own calls (track_functions), one figure
    -- for the whole installation.
    RETURN QUERY
    SELECT m.metric, 'counter', m.help, '{}'::jsonb, m.value
    FROM pg_catalog.pg_stat_user_functions f
    CROSS JOIN LATERAL (VALUES
        ('orca_tick_seconds_total', 'Time spent in orca.tick (the whole installation).',
         f.total_time / 1000.0),
        ('orca_ticks_total', 'Calls of orca.tick (the whole installation).', f.calls::double precision)
    ) AS m(metric, help, value)
    WHERE f.schemaname = 'orca' AND f.funcname = 'tick';
END
$$;
COMMENT ON FUNCTION orca.metrics() IS
'The session''s org''s metrics, one row per series: runs by status, queue depth and oldest '
'queued age per pool, leases, lapsed leases, runners and slots, sync HEADs, webhook backlog '
'and deliveries, pruned rows, and tick time. orca serve shows them at /metrics in '
'Prometheus'' text format. Example: SELECT metric, labels, value FROM orca.metrics();';

REVOKE ALL ON orca.counters FROM PUBLIC;
GRANT SELECT ON orca.counters TO orca_viewer;
REVOKE ALL ON FUNCTION
    orca._retain_seconds(text),
    orca._retention_batch(),
    orca._count(bigint, text, bigint),
    orca._tick_prune(bigint[], timestamptz),
    orca.retention(),
    orca.metrics()
FROM PUBLIC;
GRANT EXECUTE ON FUNCTION orca.metrics(), orca.retention() TO orca_viewer;

---------------------------------------------------------------------------
-- Attempt logs in the control plane: runners ship each attempt's lines
-- (orca.append_log) so that the API and the console can show them.
---------------------------------------------------------------------------

CREATE  FUNCTION "_log_lines_max"() RETURNS INT /* i32 */
STRICT STABLE PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'log_lines_max_wrapper';

CREATE TABLE orca.attempt_logs (
    org_id     bigint NOT NULL,
    attempt_id bigint NOT NULL,
    -- 1 for the attempt's first line; the runner numbers them, so a batch
    -- sent twice (a retry after a lost answer) is kept once.
    seq        integer NOT NULL CHECK (seq >= 1),
    at         timestamptz NOT NULL DEFAULT now(),
    line       text NOT NULL,
    PRIMARY KEY (attempt_id, seq),
    FOREIGN KEY (org_id, attempt_id) REFERENCES orca.attempts (org_id, id) ON DELETE CASCADE
);
COMMENT ON TABLE orca.attempt_logs IS
'The lines of each attempt''s log (its child''s output and the runner''s own lines), shipped by '
'the runner while the attempt runs; at most orca.log_lines_max per attempt, each at most 8 KiB. '
'Pruned with its run.';
ALTER TABLE orca.attempt_logs ENABLE ROW LEVEL SECURITY;
CREATE POLICY org_scope ON orca.attempt_logs USING (org_id = (SELECT orca.current_org_id()));
SELECT pg_catalog.pg_extension_config_dump('orca.attempt_logs', '');

CREATE FUNCTION orca.append_log(lease uuid, first_seq integer, lines text[]) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('append_log', 'lines', octet_length(array_to_string(append_log.lines, '', '')) + cardinality(append_log.lines), 8388608);
    t     orca.runner_tokens := orca._runner_session();
    v_org bigint := t.org_id;
    a     orca.attempts;
    v_max integer := orca._log_lines_max();
    v_n   integer;
BEGIN
    IF append_log.first_seq IS NULL OR append_log.first_seq < 1 THEN
        RAISE EXCEPTION 'first_seq must be 1 or more, got %', coalesce(append_log.first_seq::text, 'NULL')
            USING ERRCODE = 'OR050';
    END IF;
    IF append_log.lines IS NULL OR cardinality(append_log.lines) > 1000 THEN
        RAISE EXCEPTION 'lines must be an array of at most 1000 lines, got %',
                        coalesce(cardinality(append_log.lines)::text || ' lines', 'NULL')
            USING ERRCODE = 'OR050',
                  HINT = 'send a long log in batches';
    END IF;
    PERFORM orca._lease_holder(t, append_log.lease);
    a := orca._leased_attempt(v_org, append_log.lease);
    INSERT INTO orca.attempt_logs (org_id, attempt_id, seq, line)
    SELECT a.org_id, a.id, append_log.first_seq + x.i - 1, left(coalesce(x.line, ''), 8192)
    FROM unnest(append_log.lines) WITH ORDINALITY AS x(line, i)
    WHERE append_log.first_seq + x.i - 1 <= v_max
    ON CONFLICT (attempt_id, seq) DO NOTHING;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;
COMMENT ON FUNCTION orca.append_log(uuid, integer, text[]) IS
'For runners: adds lines to the log of the attempt the lease holds, numbered from first_seq '
'(a batch sent again is kept once). Lines past orca.log_lines_max are not kept; each is cut at '
'8 KiB. Returns the lines kept. Errors: OR050 (first_seq < 1, more than 1000 lines), OR012, '
'OR014 (the lease is no longer active).';

REVOKE ALL ON orca.attempt_logs FROM PUBLIC;
GRANT SELECT ON orca.attempt_logs TO orca_viewer;
REVOKE ALL ON FUNCTION orca._log_lines_max(), orca.append_log(uuid, integer, text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION orca.append_log(uuid, integer, text[]) TO orca_runner;

---------------------------------------------------------------------------
-- A sync's committed epochs with their figures (orca.record_epoch, by the
-- engine right after HEAD moved), for the API and the console.
---------------------------------------------------------------------------

CREATE TABLE orca.sync_epochs (
    org_id       bigint NOT NULL,
    sync_id      bigint NOT NULL,
    epoch        bigint NOT NULL,
    generation   integer NOT NULL,
    -- {"<stream>": rows, ...}
    rows         jsonb NOT NULL DEFAULT '{}',
    total_rows   bigint NOT NULL DEFAULT 0,
    quarantined  integer NOT NULL DEFAULT 0,
    held         integer NOT NULL DEFAULT 0,
    committed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (sync_id, epoch),
    FOREIGN KEY (org_id, sync_id) REFERENCES orca.syncs (org_id, id) ON DELETE CASCADE
);
COMMENT ON TABLE orca.sync_epochs IS
'Each committed epoch of a sync, as its engine reported it after moving HEAD: rows per stream, '
'quarantined and held files. Pruned with orca.retain_runs.';
CREATE INDEX sync_epochs_committed ON orca.sync_epochs (committed_at);
ALTER TABLE orca.sync_epochs ENABLE ROW LEVEL SECURITY;
CREATE POLICY org_scope ON orca.sync_epochs USING (org_id = (SELECT orca.current_org_id()));
SELECT pg_catalog.pg_extension_config_dump('orca.sync_epochs', '');

CREATE FUNCTION orca.record_epoch(sync text, generation integer, epoch bigint, stats jsonb,
                                  lease uuid DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('record_epoch', 'sync', octet_length(record_epoch.sync), 1024)
                         AND orca._bound('record_epoch', 'stats', octet_length(record_epoch.stats::text), 1048576);
    v_org   bigint := (orca._sync_caller(record_epoch.sync, record_epoch.lease, 'recording an epoch of')).org_id;
    s       orca.syncs := orca._sync(v_org, record_epoch.sync);
    v_rows  jsonb := coalesce(record_epoch.stats->'rows', '{}');
    v_total bigint;
BEGIN
    IF record_epoch.generation IS NULL OR record_epoch.epoch IS NULL OR record_epoch.epoch < 1
       OR jsonb_typeof(record_epoch.stats) IS DISTINCT FROM 'object'
       OR jsonb_typeof(v_rows) <> 'object'
       OR EXISTS (SELECT 1 FROM jsonb_each(v_rows) x
                  WHERE jsonb_typeof(x.value) <> 'number' OR (x.value)::numeric < 0
                     OR (x.value)::numeric <> trunc((x.value)::numeric))
       OR coalesce(jsonb_typeof(record_epoch.stats->'quarantined'), 'number') <> 'number'
       OR coalesce(jsonb_typeof(record_epoch.stats->'held'), 'number') <> 'number' THEN
        RAISE EXCEPTION 'record_epoch needs a generation, an epoch of 1 or more and stats '
                        '{"rows": {"<stream>": n}, "quarantined": n, "held": n}, got %, %, %',
            coalesce(record_epoch.generation::text, 'NULL'), coalesce(record_epoch.epoch::text, 'NULL'),
            coalesce(record_epoch.stats::text, 'NULL')
            USING ERRCODE = 'OR050';
    END IF;
    PERFORM orca._owned(s, record_epoch.generation);
    IF record_epoch.epoch > s.head_epoch THEN
        RAISE EXCEPTION 'epoch % of sync ''%'' is not committed (HEAD is at epoch %)',
                        record_epoch.epoch, s.name, s.head_epoch
            USING ERRCODE = 'OR071',
                  HINT = 'record an epoch after orca.advance_head moved HEAD to it';
    END IF;
    SELECT coalesce(sum((x.value)::numeric), 0)::bigint INTO v_total FROM jsonb_each(v_rows) x;
    INSERT INTO orca.sync_epochs AS e (org_id, sync_id, epoch, generation, rows, total_rows,
                                       quarantined, held)
    VALUES (s.org_id, s.id, record_epoch.epoch, record_epoch.generation, v_rows, v_total,
            greatest(0, coalesce((record_epoch.stats->>'quarantined')::numeric, 0))::int,
            greatest(0, coalesce((record_epoch.stats->>'held')::numeric, 0))::int)
    ON CONFLICT (sync_id, epoch) DO UPDATE
    SET generation = excluded.generation, rows = excluded.rows, total_rows = excluded.total_rows,
        quarantined = excluded.quarantined, held = excluded.held, committed_at = now();
END
$$;
COMMENT ON FUNCTION orca.record_epoch(text, integer, bigint, jsonb, uuid) IS
'For engines, under the sync run''s lease: records what a committed epoch moved '
'(stats {"rows": {"<stream>": n}, "quarantined": n, "held": n}) in orca.sync_epochs. '
'Errors: OR050 bad stats, OR070 fenced (not the sync''s generation), OR071 the epoch is not '
'committed yet, OR084 no lease.';

REVOKE ALL ON orca.sync_epochs FROM PUBLIC;
GRANT SELECT ON orca.sync_epochs TO orca_viewer;
REVOKE ALL ON FUNCTION orca.record_epoch(text, integer, bigint, jsonb, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION orca.record_epoch(text, integer, bigint, jsonb, uuid) TO orca_attempt;

-- Change data capture (issue 17): a dropped sync's generation and HEAD stay
-- on its pipeline; the slot names, their lag, orca.drop_sync, and pausing
-- and resuming (continuous) syncs.
ALTER TABLE orca.pipelines ADD COLUMN sync_generation integer, ADD COLUMN sync_epoch bigint;

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

CREATE VIEW orca.cdc_slots WITH (security_invoker = true) AS
SELECT sy.id                                                   AS sync_id,
       o.name                                                  AS org,
       sy.name                                                 AS sync,
       x.slot,
       rs.slot_name IS NOT NULL                                AS on_this_server,
       rs.active,
       rs.confirmed_flush_lsn,
       pg_wal_lsn_diff(pg_current_wal_lsn(), rs.confirmed_flush_lsn)::bigint AS lag_bytes,
       CASE WHEN pg_wal_lsn_diff(pg_current_wal_lsn(), rs.confirmed_flush_lsn) > 0
            THEN extract(epoch FROM now() - coalesce(sy.head_at, sy.created_at))::bigint
            ELSE 0 END                                          AS lag_seconds,
       pg_wal_lsn_diff(pg_current_wal_lsn(), rs.restart_lsn)::bigint AS retained_bytes,
       rs.wal_status,
       -- Nothing will read the slot again unless someone acts: the sync is
       -- paused, or has no schedule and no run queued or running.
       (rs.slot_name IS NOT NULL AND NOT rs.active
        AND pg_wal_lsn_diff(pg_current_wal_lsn(), rs.restart_lsn) > 0
        AND (coalesce(p.paused, true)
             OR (sy.definition->>'schedule' IS NULL
                 AND NOT EXISTS (SELECT 1 FROM orca.runs r
                                 WHERE r.pipeline_id = p.id
                                   AND r.status IN ('queued', 'running')))))
                                                               AS held_back
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
WHERE sy.definition->'source'->>'type' = 'postgres_cdc';
COMMENT ON VIEW orca.cdc_slots IS
'One row per postgres_cdc sync: its replication slot, whether this server holds it (a source on '
'another server shows nulls: ask that server''s pg_replication_slots), whether a session reads '
'it, how far its confirmed position is behind the WAL (lag_bytes; lag_seconds since HEAD last '
'moved while there is lag), how much WAL it keeps (retained_bytes) and held_back: a slot nothing '
'will read again unless someone acts (the sync paused, or unscheduled with no run), which pins WAL.';

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
-- sync is paused): one long-lived run per sync.
CREATE FUNCTION orca._keep_running(p_org bigint, p_sync text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    p orca.pipelines;
BEGIN
    SELECT * INTO p FROM orca.pipelines WHERE org_id = p_org AND name = p_sync;
    IF p.paused OR EXISTS (SELECT 1 FROM orca.runs r
                           WHERE r.pipeline_id = p.id AND r.status IN ('queued', 'running')) THEN
        RETURN NULL;
    END IF;
    RETURN orca.run(p_sync, 'now');
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

REVOKE ALL ON FUNCTION orca._cdc_slot(bigint, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION orca._keep_running(bigint, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION orca.drop_sync(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION orca.pause_sync(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION orca.resume_sync(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION orca.drop_sync(text), orca.pause_sync(text), orca.resume_sync(text)
    TO orca_operator;
REVOKE ALL ON orca.cdc_slots FROM PUBLIC;
GRANT SELECT ON orca.cdc_slots TO orca_viewer;

-- The supervisor of continuous syncs: orca.tick restarts a continuous sync's
-- run once it ended, after a backoff.
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
                           WHERE r.pipeline_id = p.id ORDER BY r.id DESC LIMIT 1) last ON true
        WHERE y.org_id = ANY (p_orgs)
          AND (y.definition -> 'source' ->> 'continuous') = 'true'
          AND NOT p.paused
          AND last.status IN ('failed', 'succeeded')
          AND NOT EXISTS (SELECT 1 FROM orca.runs r
                          WHERE r.pipeline_id = p.id AND r.status IN ('queued', 'running'))
        ORDER BY p.org_id, p.id
        FOR UPDATE OF p SKIP LOCKED
    LOOP
        -- Failed runs in a row: since the last run that did not fail.
        SELECT count(*) INTO v_failed
        FROM orca.runs r
        WHERE r.pipeline_id = c.pipeline_id AND r.status = 'failed'
          AND r.id > coalesce((SELECT max(x.id) FROM orca.runs x
                               WHERE x.pipeline_id = c.pipeline_id AND x.status <> 'failed'), 0);
        v_backoff := least(600, 10 * (2 ^ greatest(v_failed - 1, 0))::integer);
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

REVOKE ALL ON FUNCTION orca._tick_continuous(bigint[], timestamptz) FROM PUBLIC;

---------------------------------------------------------------------------
-- Discovery (sql/discovery.sql): orca.discover queues a discovery task
-- (runs of kind discover, claimed as command discover), a runner's engine
-- stores the catalog in orca.catalogs, orca.create_sync plans streams from
-- it, and each sync attempt reports drift from the planned version.
---------------------------------------------------------------------------

ALTER TABLE orca.runs DROP CONSTRAINT runs_kind_check;
ALTER TABLE orca.runs ADD CONSTRAINT runs_kind_check
    CHECK (kind IN ('pipeline', 'sense', 'keys', 'sync', 'discover'));
COMMENT ON TABLE orca.runs IS
'Runs: a pipeline version over partitions. trigger: schedule, backfill, manual or sensor; '
'status: queued, running, succeeded, failed or cancelled. kind: pipeline, sense (a sensor''s '
'polls), keys (a keyed pipeline''s keys task; parent_run of the runs it queued) or sync (a run '
'of a sync, request {"mode": "full"} for a backfill) or discover (orca.discover''s task).';
ALTER TABLE orca.queue DROP CONSTRAINT queue_command_check;
ALTER TABLE orca.queue ADD CONSTRAINT queue_command_check
    CHECK (command IN ('attempt', 'sense', 'keys', 'sync', 'discover'));
ALTER TABLE orca.syncs ADD COLUMN catalog_version integer;
ALTER TABLE orca.syncs ADD COLUMN drift jsonb;
ALTER TABLE orca.syncs ADD COLUMN drift_at timestamptz;

CREATE  FUNCTION "_source_check"(
	"org" TEXT, /* & str */
	"name" TEXT, /* & str */
	"source" jsonb, /* JsonB */
	"allowlist" TEXT[] /* Vec < String > */
) RETURNS jsonb /* JsonB */
IMMUTABLE STRICT PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'source_check_wrapper';

CREATE TABLE orca.catalogs (
    org_id        bigint NOT NULL REFERENCES orca.orgs (id),
    name          text NOT NULL,
    version       integer NOT NULL CHECK (version >= 1),
    -- The source as orca.discover normalized it (secrets by reference).
    source        jsonb NOT NULL,
    -- {"source": kind, "server": {...}, "streams": [...], "plan": [...]}
    catalog       jsonb NOT NULL,
    -- The discovery run that found this version, and the last that found
    -- the source unchanged since.
    run_id        bigint,
    discovered_at timestamptz NOT NULL DEFAULT now(),
    checked_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, name, version)
);
COMMENT ON TABLE orca.catalogs IS
'Source catalogs (orca.discover), per sync name and version: the source, and what a runner read '
'of it: streams (table, columns with types and nullability, primary key, replica identity, '
'rows_estimate, whether CDC can read it and what blocks it) and plan (the streams '
'orca.create_sync can take with {"catalog": true}). A new version when the source changed.';
ALTER TABLE orca.catalogs ENABLE ROW LEVEL SECURITY;
CREATE POLICY org_scope ON orca.catalogs USING (org_id = (SELECT orca.current_org_id()));
SELECT pg_catalog.pg_extension_config_dump('orca.catalogs', '');

CREATE FUNCTION orca._source_identity(p_source jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_strip_nulls(jsonb_build_object('type', p_source->'type', 'url', p_source->'url',
                                                'connector', p_source->'connector',
                                                'config', p_source->'config'))
$$;

CREATE FUNCTION orca._catalog_shape(p_catalog jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_catalog || jsonb_build_object('streams', coalesce(
        (SELECT jsonb_agg(s - 'rows_estimate' ORDER BY o)
         FROM jsonb_array_elements(CASE jsonb_typeof(p_catalog->'streams')
                                        WHEN 'array' THEN p_catalog->'streams' ELSE '[]' END)
              WITH ORDINALITY AS x(s, o)), '[]'::jsonb))
$$;

CREATE FUNCTION orca._catalog(p_org bigint, p_name text) RETURNS orca.catalogs
LANGUAGE sql STABLE AS $$
    SELECT * FROM orca.catalogs c WHERE c.org_id = p_org AND c.name = p_name
    ORDER BY c.version DESC LIMIT 1
$$;

CREATE FUNCTION orca.discover(name text, source jsonb DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('discover', 'name', octet_length(discover.name), 1024)
                         AND orca._bound('discover', 'source', octet_length(discover.source::text), 65536);
    v_org bigint := orca.current_org_id();
    v_src jsonb := discover.source;
    p     orca.pipelines;
    v_run bigint;
BEGIN
    IF discover.name IS NULL THEN
        RAISE EXCEPTION 'malformed discovery: name must not be NULL' USING ERRCODE = 'OR063';
    END IF;
    IF v_src IS NULL THEN
        SELECT sy.definition->'source' INTO v_src FROM orca.syncs sy
        WHERE sy.org_id = v_org AND sy.name = discover.name;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'unknown sync ''%'' in org ''%'': give the source to discover',
                            discover.name, (SELECT o.name FROM orca.orgs o WHERE o.id = v_org)
                USING ERRCODE = 'OR064',
                      HINT = 'SELECT orca.discover(''shop'', ''{"type": "postgres_cdc", "url": {"secret": "shop-db"}}'')';
        END IF;
    END IF;
    v_src := orca._unwrap(orca._source_check((SELECT o.name FROM orca.orgs o WHERE o.id = v_org),
                                             discover.name, v_src, orca._allowlist(v_org)));
    SELECT * INTO p FROM orca.pipelines x WHERE x.org_id = v_org AND x.name = discover.name FOR UPDATE;
    IF NOT FOUND THEN
        -- The pipeline the sync will be, so that its discovery is a run
        -- like any other (leased, retried, in the run history).
        PERFORM orca._sync_pipeline(v_org, discover.name, jsonb_build_object('source', v_src),
                                    NULL, 'default', 2);
        SELECT * INTO p FROM orca.pipelines x WHERE x.org_id = v_org AND x.name = discover.name;
    ELSIF (SELECT v.partition_kind FROM orca.pipeline_versions v WHERE v.id = p.current_version)
          IS DISTINCT FROM 'sync' THEN
        RAISE EXCEPTION 'name ''%'' belongs to a pipeline; a sync (and its catalog) needs a name of its own',
                        discover.name
            USING ERRCODE = 'OR065';
    END IF;
    INSERT INTO orca.runs (org_id, pipeline_id, version_id, partitions, trigger, run_retries, kind,
                           request)
    VALUES (v_org, p.id, p.current_version,
            ARRAY[orca._fire_partition_of('sync', '', '', 'UTC', now())], 'manual', 1, 'discover',
            jsonb_build_object('source', v_src))
    RETURNING id INTO v_run;
    PERFORM orca._event(v_org, 'run.queued', p.id, v_run, NULL,
        jsonb_build_object('trigger', 'manual', 'kind', 'discover', 'by', session_user));
    -- Not behind the sync's own run (max_runs 1): a discovery reads, it
    -- moves nothing.
    PERFORM orca._start_runs(ARRAY[v_run]);
    RETURN v_run;
END
$$;
COMMENT ON FUNCTION orca.discover(text, jsonb) IS
'Queues a discovery of a source and returns its run: a runner''s orca-engine connects to the '
'source (the control plane reads none), reads its catalog (tables, columns, types, keys, '
'replica identity, whether CDC can read each and what blocks it; an external connector''s '
'discover) and stores it in orca.catalogs under the name, as a new version when it changed. '
'name is the sync the catalog is for (it need not exist yet: orca.create_sync(name, ..., '
'''{"catalog": true}'') plans its streams from it); source NULL rediscovers the sync''s own. '
'Netguard judges the source as orca.create_sync does (OR094). Errors: OR063/OR060/OR061 bad '
'source, OR064 unknown sync, OR065 a pipeline has the name. '
'Example: SELECT orca.discover(''shop'', ''{"type": "postgres_cdc", "url": {"secret": "shop-db"}}'');';

CREATE FUNCTION orca._discovery_run(p_lease uuid) RETURNS orca.runs
LANGUAGE plpgsql AS $$
DECLARE
    v_org bigint := orca._lease_org(p_lease);
    a orca.attempts;
    r orca.runs;
BEGIN
    a := orca._live_attempt(v_org, p_lease);
    SELECT * INTO r FROM orca.runs WHERE id = a.run_id;
    IF r.kind <> 'discover' THEN
        RAISE EXCEPTION 'lease % is not a discovery''s: run % is a % run', p_lease, r.id, r.kind
            USING ERRCODE = 'OR050';
    END IF;
    RETURN r;
END
$$;

CREATE FUNCTION orca.discovery(lease uuid) RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r orca.runs := orca._discovery_run(discovery.lease);
BEGIN
    RETURN jsonb_build_object('name', (SELECT p.name FROM orca.pipelines p WHERE p.id = r.pipeline_id),
                              'source', r.request->'source', 'run', r.id,
                              'allowlist', to_jsonb(orca._allowlist(r.org_id)));
END
$$;
COMMENT ON FUNCTION orca.discovery(uuid) IS
'What the attempt of a discovery task (orca.discover) reads, under its live lease: the name, the '
'source to discover (secrets by reference: orca.attempt_secret resolves them), the run, and the '
'org''s netguard allowlist. Errors: OR012/OR014/OR015 for the lease, OR050 not a discovery''s.';

CREATE FUNCTION orca.store_catalog(lease uuid, catalog jsonb) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('store_catalog', 'catalog', octet_length(store_catalog.catalog::text), 16777216);
    r      orca.runs := orca._discovery_run(store_catalog.lease);
    v_name text := (SELECT p.name FROM orca.pipelines p WHERE p.id = r.pipeline_id);
    c      orca.catalogs;
BEGIN
    IF jsonb_typeof(store_catalog.catalog) IS DISTINCT FROM 'object'
       OR jsonb_typeof(store_catalog.catalog->'streams') IS DISTINCT FROM 'array'
       OR jsonb_typeof(store_catalog.catalog->'plan') IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'malformed catalog: an object with streams and plan lists, got %',
                        left(coalesce(store_catalog.catalog::text, 'NULL'), 200)
            USING ERRCODE = 'OR063';
    END IF;
    -- One discovery of a name at a time decides its next version.
    PERFORM pg_advisory_xact_lock(hashtextextended('orca.catalogs/' || r.org_id || '/' || v_name, 0));
    c := orca._catalog(r.org_id, v_name);
    IF c.version IS NOT NULL AND c.source = r.request->'source'
       AND orca._catalog_shape(c.catalog) = orca._catalog_shape(store_catalog.catalog) THEN
        UPDATE orca.catalogs x SET checked_at = now(), catalog = store_catalog.catalog
        WHERE x.org_id = c.org_id AND x.name = c.name AND x.version = c.version;
        PERFORM orca._event(r.org_id, 'catalog.checked', r.pipeline_id, r.id, NULL,
            jsonb_build_object('name', v_name, 'version', c.version));
        RETURN c.version;
    END IF;
    INSERT INTO orca.catalogs (org_id, name, version, source, catalog, run_id)
    VALUES (r.org_id, v_name, coalesce(c.version, 0) + 1, r.request->'source',
            store_catalog.catalog, r.id)
    RETURNING * INTO c;
    PERFORM orca._event(r.org_id, 'catalog.discovered', r.pipeline_id, r.id, NULL,
        jsonb_build_object('name', v_name, 'version', c.version,
                           'streams', jsonb_array_length(c.catalog->'streams'),
                           'plannable', jsonb_array_length(c.catalog->'plan')));
    RETURN c.version;
END
$$;
COMMENT ON FUNCTION orca.store_catalog(uuid, jsonb) IS
'A discovery task''s result, under its attempt''s live lease: stores the catalog as the name''s '
'next version in orca.catalogs (event catalog.discovered), or, when only row estimates changed, '
'refreshes the newest (catalog.checked). Returns the version. Errors: OR012/OR014/OR015 for the '
'lease, OR050 not a discovery''s, OR063 not a catalog.';

CREATE FUNCTION orca._planned_streams(c orca.catalogs, p_ask jsonb) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_want  jsonb := p_ask->'catalog';
    v_out   jsonb;
    v_table text;
BEGIN
    IF v_want = 'true'::jsonb THEN
        v_out := c.catalog->'plan';
    ELSIF jsonb_typeof(v_want) = 'array' AND jsonb_array_length(v_want) > 0 THEN
        FOR v_table IN SELECT jsonb_array_elements_text(v_want) LOOP
            IF NOT EXISTS (SELECT 1 FROM jsonb_array_elements(c.catalog->'plan') s
                           WHERE s->>'table' = v_table OR s->>'name' = v_table) THEN
                RAISE EXCEPTION 'catalog ''%'' version % plans no stream for %: %', c.name, c.version,
                                quote_literal(v_table),
                                coalesce((SELECT string_agg(x->>'table' || ' (' || coalesce(x->>'cdc_blocked_by', '') || ')', '; ')
                                          FROM jsonb_array_elements(c.catalog->'streams') x
                                          WHERE x->>'table' = v_table), 'no such table')
                    USING ERRCODE = 'OR063',
                          HINT = 'SELECT catalog->''plan'' FROM orca.catalogs lists what can be planned';
            END IF;
        END LOOP;
        SELECT jsonb_agg(s ORDER BY o) INTO v_out
        FROM jsonb_array_elements(c.catalog->'plan') WITH ORDINALITY AS x(s, o)
        WHERE s->>'table' IN (SELECT jsonb_array_elements_text(v_want))
           OR s->>'name' IN (SELECT jsonb_array_elements_text(v_want));
    ELSE
        RAISE EXCEPTION 'malformed sync: streams {"catalog": ...} takes true or a list of tables, got %',
                        coalesce(v_want::text, 'NULL')
            USING ERRCODE = 'OR063';
    END IF;
    IF v_out IS NULL OR jsonb_array_length(v_out) = 0 THEN
        RAISE EXCEPTION 'catalog ''%'' version % plans no stream: no table it found can be read by this source',
                        c.name, c.version
            USING ERRCODE = 'OR063',
                  HINT = 'orca.catalogs shows each table''s cdc_blocked_by';
    END IF;
    -- Options beside "catalog" apply to every planned stream ("mode": "append").
    RETURN (SELECT jsonb_agg(s || (p_ask - 'catalog')) FROM jsonb_array_elements(v_out) s);
END
$$;

CREATE FUNCTION orca.report_drift(sync text, generation integer, drift jsonb,
                                  lease uuid DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('report_drift', 'sync', octet_length(report_drift.sync), 1024)
                         AND orca._bound('report_drift', 'drift', octet_length(report_drift.drift::text), 1048576);
    a     orca.attempts := orca._sync_caller(report_drift.sync, report_drift.lease, 'reporting drift of');
    v_org bigint := a.org_id;
    s     orca.syncs := orca._sync(v_org, report_drift.sync);
    v_run bigint := a.run_id;
BEGIN
    PERFORM orca._owned(s, report_drift.generation);
    IF jsonb_typeof(report_drift.drift) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'drift must be a list of changes, got %',
                        left(coalesce(report_drift.drift::text, 'NULL'), 200)
            USING ERRCODE = 'OR050';
    END IF;
    IF jsonb_array_length(report_drift.drift) = 0 THEN
        UPDATE orca.syncs x SET drift = NULL, drift_at = NULL WHERE x.id = s.id AND x.drift IS NOT NULL;
        RETURN;
    END IF;
    -- The same drift again is not news: one event per change of it.
    IF s.drift IS DISTINCT FROM report_drift.drift THEN
        PERFORM orca._event(v_org, 'sync.drift',
            (SELECT p.id FROM orca.pipelines p WHERE p.org_id = v_org AND p.name = s.name), v_run, a.id,
            jsonb_build_object('sync', s.name, 'catalog_version', s.catalog_version,
                               'generation', report_drift.generation, 'changes', report_drift.drift));
    END IF;
    UPDATE orca.syncs x SET drift = report_drift.drift, drift_at = now() WHERE x.id = s.id;
END
$$;
COMMENT ON FUNCTION orca.report_drift(text, integer, jsonb, uuid) IS
'An attempt reports what its source changed since the catalog version its streams were planned '
'from (orca.syncs.catalog_version): a list of {table, column, change: added | removed | type | '
'nullable, was, now}, kept in orca.syncs.drift with an event sync.drift when it differs from the '
'last report; an empty list clears it. The stream''s schema policy still decides what the attempt '
'does. Under the lease of the sync''s run (OR084), from its current generation (OR070).';

GRANT SELECT ON orca.catalogs TO orca_viewer;
REVOKE ALL ON FUNCTION orca._source_check(text, text, jsonb, text[]), orca._catalog_shape(jsonb),
    orca._source_identity(jsonb),
    orca._catalog(bigint, text), orca.discover(text, jsonb), orca._discovery_run(uuid),
    orca.discovery(uuid), orca.store_catalog(uuid, jsonb), orca._planned_streams(orca.catalogs, jsonb),
    orca.report_drift(text, integer, jsonb, uuid)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION orca.discover(text, jsonb) TO orca_operator;
GRANT EXECUTE ON FUNCTION orca.discovery(uuid), orca.store_catalog(uuid, jsonb),
    orca.report_drift(text, integer, jsonb, uuid)
    TO orca_attempt;

-- Scaling a sync without stopping it: orca.scale_sync sets its lanes,
-- orca.sync_lanes is what a continuous attempt follows between epochs, and
-- orca.create_sync no longer restarts a continuous run for lanes alone.
CREATE FUNCTION orca.scale_sync(name text, lanes integer) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('scale_sync', 'name', octet_length(scale_sync.name), 1024);
    v_org  bigint := orca.current_org_id();
    s      orca.syncs;
    v_was  integer;
    v_kind text;
    v      orca.pipeline_versions;
    d      jsonb;
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
    v_was := coalesce((s.definition->'destination'->>'lanes')::integer, 1);
    IF v_was = scale_sync.lanes THEN
        RETURN v_was;
    END IF;
    d := jsonb_set(s.definition, '{destination,lanes}', to_jsonb(scale_sync.lanes));
    UPDATE orca.syncs x SET definition = d WHERE x.id = s.id;
    -- The pipeline's version carries the definition too (what orca.runs
    -- shows a run was made from): a new one, same schedule, pool, retries.
    SELECT pv.* INTO v FROM orca.pipeline_versions pv JOIN orca.pipelines p
        ON p.current_version = pv.id
    WHERE p.org_id = v_org AND p.name = s.name;
    IF FOUND THEN
        PERFORM orca._sync_pipeline(v_org, s.name, d, v.cron, v.pool, v.run_retries);
    END IF;
    PERFORM orca._event(v_org, 'sync.scaled',
        (SELECT p.id FROM orca.pipelines p WHERE p.org_id = v_org AND p.name = s.name), NULL, NULL,
        jsonb_build_object('sync', s.name, 'lanes', scale_sync.lanes, 'was', v_was,
                           'by', session_user));
    RETURN v_was;
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

REVOKE ALL ON FUNCTION orca.scale_sync(text, integer), orca.sync_lanes(text, integer, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION orca.scale_sync(text, integer) TO orca_operator;
GRANT EXECUTE ON FUNCTION orca.sync_lanes(text, integer, uuid) TO orca_attempt;

---------------------------------------------------------------------------
-- Table maintenance (sql/maintenance.sql): orca.maintain and
-- orca.schedule_maintenance queue runs of kind maintain (claimed as command
-- maintain), whose attempt is orca-engine maintain; a tick fires due
-- schedules; a sensor ignores a maintenance run's compaction.
---------------------------------------------------------------------------

ALTER TABLE orca.runs DROP CONSTRAINT runs_kind_check;
ALTER TABLE orca.runs ADD CONSTRAINT runs_kind_check
    CHECK (kind IN ('pipeline', 'sense', 'keys', 'sync', 'discover', 'maintain'));
COMMENT ON TABLE orca.runs IS
'Runs: a pipeline version over partitions. trigger: schedule, backfill, manual or sensor; '
'status: queued, running, succeeded, failed or cancelled. kind: pipeline, sense (a sensor''s '
'polls), keys (a keyed pipeline''s keys task; parent_run of the runs it queued) or sync (a run '
'of a sync, request {"mode": "full"} for a backfill), discover (orca.discover''s task) or '
'maintain (orca.maintain''s table maintenance, request {"dataset", "options"}).';

ALTER TABLE orca.queue DROP CONSTRAINT queue_command_check;
ALTER TABLE orca.queue ADD CONSTRAINT queue_command_check
    CHECK (command IN ('attempt', 'sense', 'keys', 'sync', 'discover', 'maintain'));

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
-- (a table an outside writer fills).
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
        RAISE EXCEPTION 'no pipeline of org ''%'' reads or writes dataset %: its maintenance runs under a pipeline that does',
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

-- pg_ext/src/helpers.rs: a cron expression checked with its SQLSTATE.
CREATE  FUNCTION "_cron_check"(
	"cron" TEXT, /* & str */
	"tz" TEXT /* & str */
) RETURNS jsonb /* JsonB */
IMMUTABLE STRICT PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'cron_check_wrapper';
REVOKE ALL ON FUNCTION orca._cron_check(text, text) FROM PUBLIC;

REVOKE ALL ON orca.maintenance FROM PUBLIC;
GRANT SELECT ON orca.maintenance TO orca_viewer;
REVOKE ALL ON FUNCTION orca._maintenance_seconds(text, jsonb, text, bigint),
    orca._maintenance_int(text, jsonb, bigint, bigint), orca._maintenance_options(jsonb),
    orca._dataset_owner(bigint, text), orca._queue_maintenance(bigint, text, jsonb, text),
    orca.maintain(text, jsonb), orca.schedule_maintenance(text, text, jsonb, text),
    orca.unschedule_maintenance(text), orca._tick_maintenance(bigint[], timestamptz),
    orca._maintenance_run(uuid), orca.maintenance_task(uuid), orca.report_maintenance(uuid, jsonb)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION orca.maintain(text, jsonb), orca.schedule_maintenance(text, text, jsonb, text),
    orca.unschedule_maintenance(text) TO orca_operator;
GRANT EXECUTE ON FUNCTION orca.maintenance_task(uuid), orca.report_maintenance(uuid, jsonb)
    TO orca_attempt;

---------------------------------------------------------------------------
-- The trust boundary, second pass (docs/security.md): an org's admin (an
-- API key) is not the installation's; only the superuser moves the clock;
-- events are pruned org by org.
---------------------------------------------------------------------------
CREATE FUNCTION orca._is_superuser() RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF nullif(current_setting('orca.api_key', true), '') IS NOT NULL THEN
        RETURN false;
    END IF;
    RETURN EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = session_user AND r.rolsuper);
END
$$;

CREATE FUNCTION orca._is_org_admin() RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- A session that presents an API key is what the key says, whatever
    -- its login may do (orca serve's login takes the caller's key).
    IF nullif(current_setting('orca.api_key', true), '') IS NOT NULL THEN
        RETURN (orca._api_key()).role = 'admin';
    END IF;
    RETURN orca._is_admin();
END
$$;

REVOKE ALL ON FUNCTION orca._is_superuser(), orca._is_org_admin() FROM PUBLIC;
-- Each org's events in id order: pruning starts at an org's oldest, and a
-- webhook reads its org's after its cursor.
CREATE INDEX events_org ON orca.events (org_id, id);
CREATE FUNCTION orca._bound(p_fn text, p_arg text, p_size bigint, p_max bigint) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_size > p_max THEN
        RAISE EXCEPTION 'orca.%: % is % bytes, more than its bound of % bytes', p_fn, p_arg, p_size, p_max
            USING ERRCODE = 'OR051',
                  HINT = 'docs/security.md lists the bound of every input';
    END IF;
    RETURN true;
END
$$;

CREATE OR REPLACE FUNCTION orca.lineage(dataset text)
RETURNS TABLE (direction text, depth integer, related text, via text, pipeline text, run bigint,
               read_snapshot bigint, commit_snapshot bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_bounded boolean := orca._bound('lineage', 'dataset', octet_length(lineage.dataset), 1024);
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

CREATE OR REPLACE FUNCTION orca.refresh_keys(pipeline text) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_bounded boolean := orca._bound('refresh_keys', 'pipeline', octet_length(refresh_keys.pipeline), 1024);
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

CREATE OR REPLACE FUNCTION orca.key_status(pipeline text)
RETURNS TABLE (key text, done boolean, active_run bigint, first_seen_at timestamptz,
               first_snapshot bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('key_status', 'pipeline', octet_length(key_status.pipeline), 1024);
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

CREATE OR REPLACE FUNCTION orca.fires(pipeline text, n integer DEFAULT 10, after timestamptz DEFAULT now())
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

CREATE OR REPLACE FUNCTION orca.pause(pipeline text) RETURNS void
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

CREATE OR REPLACE FUNCTION orca.unpause(pipeline text) RETURNS void
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

CREATE OR REPLACE FUNCTION orca.run(pipeline text, partitions text) RETURNS bigint
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

CREATE OR REPLACE FUNCTION orca.backfill(pipeline text, partitions text) RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_bounded boolean := orca._bound('backfill', 'pipeline', octet_length(backfill.pipeline), 1024)
                         AND orca._bound('backfill', 'partitions', octet_length(backfill.partitions), 65536);
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

REVOKE ALL ON FUNCTION orca._bound(text, text, bigint, bigint) FROM PUBLIC;

-- The Iceberg catalog is written through functions only (sql/iceberg.sql):
-- no role writes its tables directly any more.
CREATE FUNCTION orca._catalog_writer(p_catalog text, p_lease uuid) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_org  bigint;
    v_name text;
BEGIN
    IF p_lease IS NOT NULL THEN
        v_org := orca._lease_usable_org(p_lease);
        IF v_org IS NULL OR v_org IS DISTINCT FROM orca._lease_org(p_lease) THEN
            PERFORM orca._lease_refused(orca._lease_org(p_lease), p_lease);
        END IF;
    ELSE
        v_org := orca.current_org_id();
        IF NOT (orca._is_org_admin()
                OR CASE WHEN nullif(current_setting('orca.api_key', true), '') IS NOT NULL
                        THEN (orca._api_key()).role = 'operator'
                        ELSE pg_catalog.pg_has_role(session_user, 'orca_operator', 'MEMBER') END) THEN
            RAISE EXCEPTION 'writing the Iceberg catalog takes an attempt''s lease or an operator of the org'
                USING ERRCODE = '42501',
                      HINT = 'a pipeline binary or an engine passes its lease (ORCA_LEASE)';
        END IF;
    END IF;
    SELECT o.name INTO v_name FROM orca.orgs o WHERE o.id = v_org;
    IF p_catalog IS DISTINCT FROM v_name THEN
        RAISE EXCEPTION 'catalog % is not the catalog of org ''%''', quote_nullable(p_catalog), v_name
            USING ERRCODE = '42501',
                  HINT = 'each org has one catalog, named as the org; ORCA_ORG names it for a binary';
    END IF;
    RETURN v_org;
END
$$;

CREATE FUNCTION orca._catalog_names(p_namespace text, p_table text, p_location text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_namespace IS NULL OR length(p_namespace) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION 'a namespace is 1 to 255 characters, got %',
                        CASE WHEN length(p_namespace) > 255 THEN length(p_namespace) || ' characters'
                             ELSE quote_nullable(p_namespace) END
            USING ERRCODE = 'OR044';
    END IF;
    IF p_table IS NOT NULL AND length(p_table) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION 'a table name is 1 to 255 characters, got %',
                        CASE WHEN length(p_table) > 255 THEN length(p_table) || ' characters'
                             ELSE quote_nullable(p_table) END
            USING ERRCODE = 'OR044';
    END IF;
    IF p_location IS NOT NULL AND length(p_location) NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'a metadata location is 1 to 1000 characters, got %', length(p_location)
            USING ERRCODE = 'OR044';
    END IF;
END
$$;

CREATE FUNCTION orca.catalog_create_namespace(catalog text, namespace text,
                                              properties jsonb DEFAULT '{}', lease uuid DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('catalog_create_namespace', 'catalog', octet_length(catalog_create_namespace.catalog), 1024)
                         AND orca._bound('catalog_create_namespace', 'namespace', octet_length(catalog_create_namespace.namespace), 1024)
                         AND orca._bound('catalog_create_namespace', 'properties', octet_length(catalog_create_namespace.properties::text), 65536);
    v_org bigint;
    p     record;
    v_n   integer;
BEGIN
    PERFORM orca._catalog_names(catalog_create_namespace.namespace, NULL, NULL);
    v_org := orca._catalog_writer(catalog_create_namespace.catalog, catalog_create_namespace.lease);
    IF jsonb_typeof(coalesce(catalog_create_namespace.properties, '{}')) <> 'object' THEN
        RAISE EXCEPTION 'a namespace''s properties are an object of strings, got a JSON %',
                        jsonb_typeof(catalog_create_namespace.properties)
            USING ERRCODE = 'OR044';
    END IF;
    IF EXISTS (SELECT 1 FROM jsonb_each(catalog_create_namespace.properties) p
               WHERE jsonb_typeof(p.value) <> 'string') THEN
        RAISE EXCEPTION 'a namespace''s properties are an object of strings'
            USING ERRCODE = 'OR044';
    END IF;
    INSERT INTO public.iceberg_namespace_properties AS n
        (catalog_name, namespace, property_key, property_value)
    VALUES (catalog_create_namespace.catalog, catalog_create_namespace.namespace, 'exists', 'true')
    ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    IF v_n = 0 THEN
        RETURN false;
    END IF;
    FOR p IN SELECT * FROM jsonb_each_text(coalesce(catalog_create_namespace.properties, '{}'))
             WHERE key <> 'exists' LOOP
        IF length(p.key) > 255 OR length(p.value) > 1000 THEN
            RAISE EXCEPTION 'namespace property % is longer than the catalog holds (255, 1000)',
                            left(p.key, 64)
                USING ERRCODE = 'OR044';
        END IF;
        INSERT INTO public.iceberg_namespace_properties VALUES
            (catalog_create_namespace.catalog, catalog_create_namespace.namespace, p.key, p.value);
    END LOOP;
    RETURN true;
END
$$;
COMMENT ON FUNCTION orca.catalog_create_namespace(text, text, jsonb, uuid) IS
'Creates a namespace in the caller''s org''s Iceberg catalog (catalog = the org''s name), '
'with string properties; false when it exists already. Takes the org from the attempt''s lease '
'(pipeline binaries, engines) or, without one, from the session: operators and admins of the '
'org. Errors: OR044 bad name or property, OR012/OR014/OR015 the lease, 42501 another org''s '
'catalog.';

CREATE FUNCTION orca.catalog_create_table(catalog text, namespace text, name text,
                                          metadata_location text, lease uuid DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('catalog_create_table', 'catalog', octet_length(catalog_create_table.catalog), 1024)
                         AND orca._bound('catalog_create_table', 'namespace', octet_length(catalog_create_table.namespace), 1024)
                         AND orca._bound('catalog_create_table', 'name', octet_length(catalog_create_table.name), 1024)
                         AND orca._bound('catalog_create_table', 'metadata_location', octet_length(catalog_create_table.metadata_location), 4096);
    v_org bigint;
BEGIN
    PERFORM orca._catalog_names(catalog_create_table.namespace, catalog_create_table.name,
                                catalog_create_table.metadata_location);
    IF catalog_create_table.metadata_location IS NULL THEN
        RAISE EXCEPTION 'a table needs its metadata location' USING ERRCODE = 'OR044';
    END IF;
    v_org := orca._catalog_writer(catalog_create_table.catalog, catalog_create_table.lease);
    IF NOT EXISTS (SELECT 1 FROM public.iceberg_namespace_properties n
                   WHERE n.catalog_name = catalog_create_table.catalog
                     AND n.namespace = catalog_create_table.namespace)
       AND NOT EXISTS (SELECT 1 FROM public.iceberg_tables t
                       WHERE t.catalog_name = catalog_create_table.catalog
                         AND t.table_namespace = catalog_create_table.namespace) THEN
        RAISE EXCEPTION 'no namespace % in the catalog of org ''%''',
                        quote_literal(catalog_create_table.namespace), catalog_create_table.catalog
            USING ERRCODE = 'OR045',
                  HINT = 'create it first (orca.catalog_create_namespace)';
    END IF;
    INSERT INTO public.iceberg_tables
        (catalog_name, table_namespace, table_name, metadata_location, iceberg_type)
    VALUES (catalog_create_table.catalog, catalog_create_table.namespace, catalog_create_table.name,
            catalog_create_table.metadata_location, 'TABLE')
    ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'table %.% exists already in the catalog of org ''%''',
                        catalog_create_table.namespace, catalog_create_table.name,
                        catalog_create_table.catalog
            USING ERRCODE = 'OR045';
    END IF;
END
$$;
COMMENT ON FUNCTION orca.catalog_create_table(text, text, text, text, uuid) IS
'Adds a table to a namespace of the caller''s org''s Iceberg catalog, pointing at its first '
'metadata file (written by the caller). Who may: as orca.catalog_create_namespace. Errors: '
'OR044 bad name or location, OR045 no such namespace or the table exists.';

CREATE FUNCTION orca.catalog_commit(catalog text, namespace text, name text, expected text,
                                    metadata_location text, lease uuid DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('catalog_commit', 'catalog', octet_length(catalog_commit.catalog), 1024)
                         AND orca._bound('catalog_commit', 'namespace', octet_length(catalog_commit.namespace), 1024)
                         AND orca._bound('catalog_commit', 'name', octet_length(catalog_commit.name), 1024)
                         AND orca._bound('catalog_commit', 'expected', octet_length(catalog_commit.expected), 4096)
                         AND orca._bound('catalog_commit', 'metadata_location', octet_length(catalog_commit.metadata_location), 4096);
    v_org bigint;
BEGIN
    PERFORM orca._catalog_names(catalog_commit.namespace, catalog_commit.name,
                                catalog_commit.metadata_location);
    PERFORM orca._catalog_names(catalog_commit.namespace, catalog_commit.name, catalog_commit.expected);
    IF catalog_commit.metadata_location IS NULL OR catalog_commit.expected IS NULL THEN
        RAISE EXCEPTION 'a commit names the metadata it expects and the one it installs'
            USING ERRCODE = 'OR044';
    END IF;
    v_org := orca._catalog_writer(catalog_commit.catalog, catalog_commit.lease);
    UPDATE public.iceberg_tables t
    SET metadata_location = catalog_commit.metadata_location,
        previous_metadata_location = catalog_commit.expected
    WHERE t.catalog_name = catalog_commit.catalog AND t.table_namespace = catalog_commit.namespace
      AND t.table_name = catalog_commit.name AND t.metadata_location = catalog_commit.expected
      AND (t.iceberg_type = 'TABLE' OR t.iceberg_type IS NULL);
    IF FOUND THEN
        RETURN true;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM public.iceberg_tables t
                   WHERE t.catalog_name = catalog_commit.catalog
                     AND t.table_namespace = catalog_commit.namespace
                     AND t.table_name = catalog_commit.name) THEN
        RAISE EXCEPTION 'no table %.% in the catalog of org ''%''', catalog_commit.namespace,
                        catalog_commit.name, catalog_commit.catalog
            USING ERRCODE = 'OR045';
    END IF;
    RETURN false;
END
$$;
COMMENT ON FUNCTION orca.catalog_commit(text, text, text, text, text, uuid) IS
'Commits a table of the caller''s org''s Iceberg catalog: points it at metadata_location if it '
'still points at expected (a compare-and-swap) and returns whether it did; false means another '
'commit came first (reload and retry). Who may: as orca.catalog_create_namespace. Errors: '
'OR044 bad name or location, OR045 no such table.';

CREATE FUNCTION orca.catalog_drop_table(catalog text, namespace text, name text,
                                        lease uuid DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('catalog_drop_table', 'catalog', octet_length(catalog_drop_table.catalog), 1024)
                         AND orca._bound('catalog_drop_table', 'namespace', octet_length(catalog_drop_table.namespace), 1024)
                         AND orca._bound('catalog_drop_table', 'name', octet_length(catalog_drop_table.name), 1024);
    v_org bigint;
BEGIN
    PERFORM orca._catalog_names(catalog_drop_table.namespace, catalog_drop_table.name, NULL);
    v_org := orca._catalog_writer(catalog_drop_table.catalog, catalog_drop_table.lease);
    DELETE FROM public.iceberg_tables t
    WHERE t.catalog_name = catalog_drop_table.catalog
      AND t.table_namespace = catalog_drop_table.namespace
      AND t.table_name = catalog_drop_table.name
      AND (t.iceberg_type = 'TABLE' OR t.iceberg_type IS NULL);
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION orca.catalog_drop_table(text, text, text, uuid) IS
'Removes a table from the caller''s org''s Iceberg catalog (its files stay: table maintenance '
'or the org removes them); false when there was none. Who may: as '
'orca.catalog_create_namespace.';

REVOKE ALL ON FUNCTION orca._catalog_writer(text, uuid), orca._catalog_names(text, text, text),
    orca.catalog_create_namespace(text, text, jsonb, uuid),
    orca.catalog_create_table(text, text, text, text, uuid),
    orca.catalog_commit(text, text, text, text, text, uuid),
    orca.catalog_drop_table(text, text, text, uuid)
    FROM PUBLIC;
REVOKE INSERT, UPDATE, DELETE ON public.iceberg_tables, public.iceberg_namespace_properties
    FROM orca_attempt, orca_runner, orca_viewer, orca_operator, orca_admin;
GRANT EXECUTE ON FUNCTION
    orca.catalog_create_namespace(text, text, jsonb, uuid),
    orca.catalog_create_table(text, text, text, text, uuid),
    orca.catalog_commit(text, text, text, text, text, uuid),
    orca.catalog_drop_table(text, text, text, uuid)
    TO orca_attempt, orca_operator;
