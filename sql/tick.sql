-- Time: orca.tick does all periodic work, at an instant the caller may
-- inject (tests do), so that cron and DST behaviour is testable to the second.
--
-- A tick costs what is due, not what is registered: each schedule keeps its
-- next fire (schedules.next_fire_at) and each sensor its last poll, both
-- indexed, so an idle tick reads a few index pages however many pipelines
-- there are. Each phase is a function of its own and returns its counts.

-- The orgs orca.tick works on: every org for an admin who did not pick one,
-- otherwise the session's org.
CREATE FUNCTION orca._tick_orgs() RETURNS bigint[]
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

-- Phase 1: due cron fires become runs. Only schedules whose next fire is due
-- are read (the schedules_due index). SKIP LOCKED: a concurrent tick takes
-- the schedules this one holds, and the unique index on (pipeline, fire_at)
-- keeps a fire to one run whatever happens.
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
    v_later   bigint[] := '{}';
    v_made    bigint[];
    v_fired   integer;
BEGIN
    -- The common case first, set-based, a thousand schedules a statement:
    -- a schedule whose clock has started and that has exactly one fire due,
    -- whose partition exists. Its run is made, its schedule moved on and
    -- its run started (or queued) in statements over the whole batch, where
    -- a schedule at a time cost about a millisecond a fire. What is not
    -- this case (a first tick, several fires, a fire before the first
    -- partition) stays locked by this transaction and is left to the loop
    -- after, which does it as before.
    LOOP
        WITH due AS MATERIALIZED (
            SELECT sc.pipeline_id, sc.org_id, sc.cron, sc.tz, sc.fills, sc.fired_until,
                   sc.next_fire_at, x.paused, x.max_runs, x.version_id, x.partition_kind,
                   x.partition_start, x.run_retries
            FROM orca.schedules sc
            CROSS JOIN LATERAL (
                SELECT p.paused, p.max_runs, v.id AS version_id, v.partition_kind,
                       v.partition_start, v.run_retries
                FROM orca.pipelines p JOIN orca.pipeline_versions v ON v.id = p.current_version
                WHERE p.id = sc.pipeline_id
            ) x
            WHERE sc.next_fire_at <= p_now AND sc.org_id = ANY (p_orgs)
              AND NOT (sc.pipeline_id = ANY (v_later))
            ORDER BY sc.next_fire_at
            LIMIT 1000
            FOR UPDATE OF sc SKIP LOCKED
        ), fired AS MATERIALIZED (
            -- next_fire_at is the first fire after fired_until: it is the only
            -- one due when the fire after it is later than now, and that one
            -- is the schedule's next.
            SELECT d.*, f.after,
                   CASE WHEN f.started AND (f.after IS NULL OR f.after > p_now)
                        THEN orca._fire_partition_of(d.partition_kind, d.partition_start, d.fills,
                                                     d.tz, d.next_fire_at) END AS part
            FROM due d
            CROSS JOIN LATERAL (
                SELECT d.fired_until IS NOT NULL AND isfinite(d.next_fire_at)
                           AND d.next_fire_at > d.fired_until AS started
            ) g
            CROSS JOIN LATERAL (
                SELECT g.started,
                       CASE WHEN g.started THEN orca._next_fire(d.cron, d.tz, d.next_fire_at) END AS after
            ) f
        ), simple AS (
            SELECT * FROM fired WHERE part IS NOT NULL
        ), made AS (
            -- A pipeline without a cap starts its run at once: made running,
            -- it is not written twice (orca._runs_created_many gives it its
            -- attempt).
            INSERT INTO orca.runs (org_id, pipeline_id, version_id, partitions, trigger, fire_at,
                                   run_retries, kind, status, started_at, attempts)
            SELECT y.org_id, y.pipeline_id, y.version_id, ARRAY[y.part], 'schedule', y.next_fire_at,
                   y.run_retries,
                   CASE WHEN y.partition_kind = 'sync' THEN 'sync' ELSE 'pipeline' END,
                   CASE WHEN y.max_runs IS NULL THEN 'running' ELSE 'queued' END,
                   CASE WHEN y.max_runs IS NULL THEN now() END,
                   CASE WHEN y.max_runs IS NULL THEN 1 ELSE 0 END
            FROM simple y WHERE NOT y.paused
            ORDER BY y.next_fire_at, y.pipeline_id
            ON CONFLICT (pipeline_id, fire_at) WHERE fire_at IS NOT NULL DO NOTHING
            RETURNING id
        ), moved AS (
            UPDATE orca.schedules sc
            SET fired_until = p_now, last_fire_at = y.next_fire_at, next_fire_at = y.after
            FROM simple y WHERE sc.pipeline_id = y.pipeline_id
        )
        SELECT (SELECT count(*) FROM due),
               (SELECT array_agg(id ORDER BY id) FROM made),
               v_later || coalesce((SELECT array_agg(pipeline_id) FROM fired
                                    WHERE part IS NULL), '{}'),
               (SELECT count(*) FROM simple WHERE NOT paused)
        INTO v_got, v_made, v_later, v_fired;
        n_fires := n_fires + v_fired;
        n_runs := n_runs + coalesce(cardinality(v_made), 0);
        PERFORM orca._runs_created_many(v_made);
        EXIT WHEN v_got < 1000;
    END LOOP;

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

-- Phase 2: leases whose deadline passed are lost; their runs retry while the
-- lost-attempt budget lasts. Live leases are few (one per busy runner slot),
-- so they are scanned rather than indexed: an index on the deadline would
-- make every heartbeat's update a non-HOT one.
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

-- Phase 3: sensors. Snapshots that other pipelines' succeeded runs committed
-- start runs now; outside snapshots are found by polls that runners run.
-- Only sensors with something to do are read: those whose commit cursor is
-- behind their org's newest commit, and those whose next poll is due.
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

-- Phase 4: queued runs start within their pipeline's max_runs.
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

CREATE FUNCTION orca.tick(now timestamptz DEFAULT now()) RETURNS jsonb
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
        || orca._tick_prune(v_orgs, v_now)
        || orca._tick_tasks(v_orgs, v_now)
        || orca._tick_incidents(v_orgs, v_now);
END
$$;
COMMENT ON FUNCTION orca.tick(timestamptz) IS
'Does all periodic work at instant now: due cron fires become runs (one per fire, whatever '
'the number of ticks), leases past their deadline are lost and their runs retried, queued '
'runs start within max_runs, sensors start runs for new snapshots and queue their polls, '
'continuous syncs whose run ended get a new one after a backoff (orca._tick_continuous), due '
'table maintenance schedules queue their runs (orca.schedule_maintenance), the tasks of '
'task leases past their deadline are tried again (orca.claim_tasks), pools with work and no live '
'runner open an incident (and close it when one is back), and '
'history older than the orca.retain_* settings is pruned in batches (orca.retention()). '
'Idempotent for the same now. The background worker calls it '
'every orca.tick_ms; without it, call it from cron, a runner or a test. An admin who set no '
'orca.org ticks every org; anyone else ticks the session''s org (a runner token''s, for a '
'runner; an API key''s, whatever its role). Only the installation''s superuser may pass a now '
'other than the transaction''s time (OR086). Returns counts.';
