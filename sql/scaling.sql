-- The autoscaling signal: the work each pool of the session's org has,
-- waiting and running, counted from the tables orca.claim and
-- orca.claim_tasks take work from. KEDA's postgresql scaler reads
-- orca.pool_backlog; its prometheus scaler reads the orca_pool_* series of
-- orca.metrics() (docs/deploy.md).

CREATE FUNCTION orca.pool_load()
RETURNS TABLE (pool text, queued_attempts bigint, running_attempts bigint,
               queued_tasks bigint, running_tasks bigint, runners bigint, slots bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    WITH o AS (SELECT orca.current_org_id() AS id),
    qa AS (SELECT q.pool, count(*) AS n
           FROM orca.queue q, o WHERE q.org_id = o.id GROUP BY q.pool),
    ra AS (SELECT a.pool, count(*) AS n
           FROM orca.leases l JOIN orca.attempts a ON a.id = l.attempt_id, o
           WHERE l.org_id = o.id GROUP BY a.pool),
    qt AS (SELECT t.pool, sum(t.size) AS n
           FROM orca.task_queue t, o WHERE t.org_id = o.id GROUP BY t.pool),
    rt AS (SELECT b.pool, sum(cardinality(b.indexes)) AS n
           FROM orca.task_leases l JOIN orca.task_batches b ON b.id = l.batch_id, o
           WHERE l.org_id = o.id GROUP BY b.pool),
    ru AS (SELECT x.pool, count(*) AS n, sum(x.slots) AS slots
           FROM orca.runners x, o
           WHERE x.org_id = o.id AND x.last_seen > orca._runner_live_since()
           GROUP BY x.pool),
    -- Every pool the org uses shows, with zeros when it is idle: a scaler
    -- scales an idle pool to zero instead of failing on a missing row.
    pools AS (
        SELECT qa.pool FROM qa UNION SELECT ra.pool FROM ra
        UNION SELECT qt.pool FROM qt UNION SELECT rt.pool FROM rt
        UNION SELECT ru.pool FROM ru
        UNION SELECT t.pool FROM orca.runner_tokens t, o
              WHERE t.org_id = o.id AND t.revoked_at IS NULL
        UNION SELECT v.pool FROM orca.pipeline_versions v, o WHERE v.org_id = o.id
    )
    SELECT p.pool, coalesce(qa.n, 0), coalesce(ra.n, 0), coalesce(qt.n, 0)::bigint,
           coalesce(rt.n, 0)::bigint, coalesce(ru.n, 0), coalesce(ru.slots, 0)::bigint
    FROM pools p
    LEFT JOIN qa ON qa.pool = p.pool LEFT JOIN ra ON ra.pool = p.pool
    LEFT JOIN qt ON qt.pool = p.pool LEFT JOIN rt ON rt.pool = p.pool
    LEFT JOIN ru ON ru.pool = p.pool
    ORDER BY p.pool
$$;
COMMENT ON FUNCTION orca.pool_load() IS
'Per pool of the session''s org: attempts queued (orca.queue) and running (leased), tasks '
'queued (in batches waiting for a runner, retries waiting for their backoff included) and '
'running (in leased batches), and the runners seen in the last five minutes with their slots. '
'Every pool a pipeline version, a live runner token or a runner names shows, idle ones with '
'zeros. Example: SELECT * FROM orca.pool_load();';

CREATE FUNCTION orca.pool_backlog(pool text DEFAULT 'default', kind text DEFAULT 'attempts')
RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_bounded boolean := orca._bound('pool_backlog', 'pool', octet_length(pool_backlog.pool), 1024)
                         AND orca._bound('pool_backlog', 'kind', octet_length(pool_backlog.kind), 1024);
    v_row record;
BEGIN
    IF kind IS NULL OR kind NOT IN ('attempts', 'tasks') THEN
        RAISE EXCEPTION 'unknown backlog kind %: expected ''attempts'' (queued and running '
                        'attempts, one slot each) or ''tasks'' (queued and running tasks, one '
                        'task worker each)', coalesce(quote_literal(kind), 'NULL')
            USING ERRCODE = 'OR103';
    END IF;
    SELECT * INTO v_row FROM orca.pool_load() l WHERE l.pool = pool_backlog.pool;
    IF NOT FOUND THEN
        -- A scaler that names a pool nothing uses (a typo) would keep it at
        -- zero runners for ever: say so instead.
        RAISE EXCEPTION 'unknown pool % in org %: no pipeline version, runner token or runner names it',
                        coalesce(quote_literal(pool), 'NULL'),
                        quote_literal((SELECT o.name FROM orca.orgs o WHERE o.id = orca.current_org_id()))
            USING ERRCODE = 'OR102';
    END IF;
    IF kind = 'tasks' THEN
        RETURN v_row.queued_tasks + v_row.running_tasks;
    END IF;
    RETURN v_row.queued_attempts + v_row.running_attempts;
END
$$;
COMMENT ON FUNCTION orca.pool_backlog(text, text) IS
'The work a pool of the session''s org wants capacity for: queued plus running attempts (kind '
'''attempts'', one runner slot each) or tasks (kind ''tasks'', one task worker each). The '
'query of KEDA''s postgresql scaler, with targetQueryValue the slots (or task workers) of one '
'runner. Example: SELECT orca.pool_backlog(''default'');';
