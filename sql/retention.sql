-- Retention and metrics. orca.tick prunes what is older than the
-- orca.retain_* settings, a bounded batch per table per tick, and never
-- what something live still needs; orca.metrics() is what orca serve's
-- /metrics shows, read from the same tables.

-- Counters that must survive pruning (a count of history rows goes down when
-- the history is pruned, which a Prometheus counter must never do).
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

-- Finds finished runs old enough to prune, oldest finish first.
CREATE INDEX runs_finished ON orca.runs (finished_at) WHERE finished_at IS NOT NULL;

-- The retention settings, as orca.tick applies them.
CREATE FUNCTION orca.retention()
RETURNS TABLE (what text, setting text, keep_seconds integer, keeps text)
LANGUAGE sql STABLE AS $$
    SELECT x.what, x.setting, orca._retain_seconds(x.what),
           CASE WHEN orca._retain_seconds(x.what) = 0 THEN 'forever'
                ELSE make_interval(secs => orca._retain_seconds(x.what))::text END
    FROM (VALUES ('runs', 'orca.retain_runs'), ('events', 'orca.retain_events'),
                 ('webhook_deliveries', 'orca.retain_webhook_deliveries'),
                 ('runners', 'orca.retain_runners'), ('tasks', 'orca.retain_tasks'))
         AS x(what, setting)
$$;
COMMENT ON FUNCTION orca.retention() IS
'How long orca.tick keeps finished runs (with their attempts, step states, reads and commits), '
'events, webhook delivery rows, runners not seen since and a finished run''s tasks (then '
'summarised into orca.task_steps), from the orca.retain_* settings (0: forever; for tasks, as '
'long as the run); orca.retention_batch bounds the rows pruned per table per tick. '
'Example: SELECT * FROM orca.retention();';

-- Phase 5: pruning. Kept whatever their age:
--   runs that are not finished, and what they own;
--   runs whose commits a sensor has not looked at yet;
--   a keyed pipeline's runs under its current registry hash (they say which
--   keys are done: orca.key_status);
--   events after the cursor of an enabled webhook of their org (not
--   delivered yet);
--   runners holding a lease.
-- Each table is read from its oldest rows (an index in age order), so a tick
-- with nothing to prune reads a page or two.
-- Each org's events in id order: pruning starts at an org's oldest, and a
-- webhook reads its org's after its cursor.
CREATE INDEX events_org ON orca.events (org_id, id);

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

-- What /metrics shows, for the session's org: gauges read off the control
-- plane's tables and counters from orca.counters. Runners and engines report
-- through Postgres (heartbeats, leases, a sync's HEAD), so this is the one
-- place to scrape.
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

    -- The autoscaling signal (orca.pool_load): every pool the org uses,
    -- idle ones at zero, so a prometheus scaler's query always has a value.
    RETURN QUERY
    SELECT m.metric, 'gauge', m.help, jsonb_build_object('pool', l.pool, 'state', m.state), m.value
    FROM orca.pool_load() l
    CROSS JOIN LATERAL (VALUES
        ('orca_pool_attempts', 'Attempts by pool and state: queued (waiting for a runner) or running (leased).',
         'queued', l.queued_attempts::double precision),
        ('orca_pool_attempts', 'Attempts by pool and state: queued (waiting for a runner) or running (leased).',
         'running', l.running_attempts::double precision),
        ('orca_pool_tasks', 'Tasks by pool and state: queued (in batches waiting for a runner) or running (in leased batches).',
         'queued', l.queued_tasks::double precision),
        ('orca_pool_tasks', 'Tasks by pool and state: queued (in batches waiting for a runner) or running (in leased batches).',
         'running', l.running_tasks::double precision)
    ) AS m(metric, help, state, value);

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
'queued age per pool, attempts and tasks queued and running per pool, leases, lapsed leases, runners and slots, sync HEADs, webhook backlog '
'and deliveries, pruned rows, and tick time. orca serve shows them at /metrics in '
'Prometheus'' text format. Example: SELECT metric, labels, value FROM orca.metrics();';
