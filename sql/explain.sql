-- Why is this run not running, or not finished? orca.explain answers from
-- the rows and with the helpers orca.claim, orca.tick and the start of
-- queued runs decide with (_max_runs_holders, _runner_live_since,
-- _handed_back, _continuous_backoff, the queue's attempt order, a lease's
-- deadline), so what it says is what they will do.

CREATE FUNCTION orca.explain(run bigint)
RETURNS TABLE (code text, message text, blocked_by jsonb, since timestamptz, until timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_org     bigint := orca.current_org_id();
    r         orca.runs;
    p         orca.pipelines;
    a         orca.attempts;
    l         orca.leases;
    v_cmd     text;
    v_holders bigint[];
    v_ahead   bigint;
    v_live    jsonb;
    v_able    integer;
    v_seen    timestamptz;
    v_last    text;
    v_n       integer;
    v_slots   bigint;
    v_running bigint;
    v_at      timestamptz;
    v_by      text;
    b         record;
    t         record;
BEGIN
    SELECT * INTO r FROM orca.runs x WHERE x.id = explain.run AND x.org_id = v_org;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown run %', coalesce(explain.run::text, 'NULL') USING ERRCODE = 'OR011';
    END IF;
    SELECT * INTO p FROM orca.pipelines x WHERE x.id = r.pipeline_id;
    SELECT * INTO a FROM orca.attempts x WHERE x.run_id = r.id ORDER BY x.number DESC, x.id DESC LIMIT 1;
    SELECT e.at, e.data->>'by' INTO v_at, v_by FROM orca.events e
    WHERE e.org_id = v_org AND e.pipeline_id = p.id AND e.kind = 'pipeline.paused'
    ORDER BY e.id DESC LIMIT 1;

    -- History first: attempts lost (their lease lapsed and a tick handed the
    -- run on) and handed back, which explain a run that keeps starting over.
    FOR b IN SELECT x.number, x.runner, x.error, x.finished_at FROM orca.attempts x
             WHERE x.run_id = r.id AND x.status = 'lost' ORDER BY x.number LOOP
        RETURN QUERY SELECT 'lease_reclaimed',
            format('attempt %s on runner %s was lost and handed on by orca.tick: %s',
                   b.number, b.runner, b.error),
            jsonb_build_object('attempt', b.number, 'runner', b.runner),
            b.finished_at, NULL::timestamptz;
    END LOOP;
    v_n := orca._handed_back(r.id);
    IF v_n >= 3 THEN
        RETURN QUERY SELECT 'handed_back',
            format('handed back %s times in the last 10 minutes (the 10th time in 10 minutes '
                   'fails the next attempt): %s', v_n,
                   (SELECT x.error FROM orca.attempts x WHERE x.run_id = r.id
                      AND x.status = 'released' ORDER BY x.id DESC LIMIT 1)),
            jsonb_build_object('times', v_n),
            (SELECT min(x.finished_at) FROM orca.attempts x WHERE x.run_id = r.id
               AND x.status = 'released' AND x.finished_at > now() - interval '10 minutes'),
            NULL::timestamptz;
    END IF;

    IF r.status IN ('succeeded', 'failed', 'cancelled') THEN
        RETURN QUERY SELECT 'finished',
            format('run %s %s at %s%s', r.id, r.status, r.finished_at,
                   CASE WHEN r.error IS NOT NULL THEN ': ' || r.error ELSE '' END),
            NULL::jsonb, r.finished_at, NULL::timestamptz;
        -- A continuous sync's run that ended gets a successor after a
        -- backoff, unless the sync is paused or the run was cancelled.
        IF r.kind = 'sync' AND r.status <> 'cancelled' AND NOT p.paused
           AND EXISTS (SELECT 1 FROM orca.syncs y WHERE y.org_id = v_org AND y.name = p.name
                         AND (y.definition -> 'source' ->> 'continuous') = 'true')
           AND NOT EXISTS (SELECT 1 FROM orca.runs x WHERE x.pipeline_id = p.id AND x.kind = 'sync'
                             AND x.id > r.id) THEN
            SELECT * INTO b FROM orca._continuous_backoff(p.id);
            RETURN QUERY SELECT 'restart_backoff',
                format('continuous sync %s starts a new run after %s s (%s failed runs in a row) '
                       'at the first orca.tick after %s',
                       p.name, b.backoff_seconds, b.failed,
                       coalesce(r.finished_at, r.created_at) + make_interval(secs => b.backoff_seconds)),
                jsonb_build_object('failed_runs', b.failed, 'backoff_seconds', b.backoff_seconds),
                coalesce(r.finished_at, r.created_at),
                coalesce(r.finished_at, r.created_at) + make_interval(secs => b.backoff_seconds);
        ELSIF p.paused AND r.kind = 'sync' THEN
            RETURN QUERY SELECT 'paused',
                format('sync %s is paused (by %s): orca.resume_sync starts it again', p.name,
                       coalesce(v_by, 'someone')),
                jsonb_build_object('by', v_by), v_at, NULL::timestamptz;
        END IF;
        RETURN;
    END IF;

    IF r.status = 'queued' THEN
        IF p.paused THEN
            RETURN QUERY SELECT 'paused',
                format('pipeline %s is paused (by %s): its queued runs wait for orca.unpause',
                       p.name, coalesce(v_by, 'someone')),
                jsonb_build_object('by', v_by), v_at, NULL::timestamptz;
        END IF;
        v_holders := orca._max_runs_holders(p.id);
        SELECT count(*) INTO v_ahead FROM orca.runs x
        WHERE x.pipeline_id = p.id AND x.status = 'queued' AND x.id < r.id;
        IF p.max_runs IS NOT NULL AND cardinality(v_holders) + v_ahead >= p.max_runs THEN
            RETURN QUERY SELECT 'max_runs',
                format('pipeline %s runs at most %s at a time: run%s %s hold%s the slot%s%s',
                       p.name, p.max_runs,
                       CASE WHEN cardinality(v_holders) = 1 THEN '' ELSE 's' END,
                       array_to_string(v_holders, ', '),
                       CASE WHEN cardinality(v_holders) = 1 THEN 's' ELSE '' END,
                       CASE WHEN p.max_runs = 1 THEN '' ELSE 's' END,
                       CASE WHEN v_ahead > 0 THEN format(', and %s queued run%s go%s first', v_ahead,
                                                         CASE WHEN v_ahead = 1 THEN '' ELSE 's' END,
                                                         CASE WHEN v_ahead = 1 THEN 'es' ELSE '' END)
                            ELSE '' END),
                jsonb_build_object('runs', to_jsonb(v_holders), 'queued_ahead', v_ahead,
                                   'max_runs', p.max_runs),
                greatest(r.created_at,
                         (SELECT max(x.started_at) FROM orca.runs x WHERE x.id = ANY (v_holders))),
                NULL::timestamptz;
        ELSIF NOT p.paused THEN
            RETURN QUERY SELECT 'starting',
                'nothing holds it: the next orca.tick starts it'::text,
                NULL::jsonb, r.created_at, NULL::timestamptz;
        END IF;
        RETURN;
    END IF;

    -- Running: what its newest attempt waits for.
    IF a.status = 'pending' THEN
        v_cmd := orca._command(r.kind);
        SELECT count(*) INTO v_ahead FROM orca.queue q
        WHERE q.org_id = v_org AND q.pool = a.pool AND q.attempt_id < a.id;
        SELECT coalesce(jsonb_agg(jsonb_build_object('runner', x.name, 'commands', x.commands,
                                                     'slots', x.slots, 'last_seen', x.last_seen)
                                  ORDER BY x.name), '[]'),
               count(*), count(*) FILTER (WHERE x.commands IS NULL OR v_cmd = ANY (x.commands)),
               sum(x.slots)
        INTO v_live, v_n, v_able, v_slots
        FROM orca.runners x
        WHERE x.org_id = v_org AND x.pool = a.pool AND x.last_seen > orca._runner_live_since();
        IF v_n = 0 THEN
            SELECT x.last_seen, x.name INTO v_seen, v_last FROM orca.runners x
            WHERE x.org_id = v_org AND x.pool = a.pool ORDER BY x.last_seen DESC LIMIT 1;
            RETURN QUERY SELECT 'no_live_runner',
                format('attempt %s waits in pool %s, which has no live runner (%s)', a.number,
                       a.pool, CASE WHEN v_seen IS NULL THEN 'none was ever seen'
                                    ELSE format('the last, %s, was seen at %s', v_last, v_seen) END),
                jsonb_build_object('pool', a.pool, 'last_runner', v_last, 'last_seen', v_seen),
                greatest(a.created_at, v_seen), NULL::timestamptz;
        ELSIF v_able = 0 THEN
            RETURN QUERY SELECT 'no_runner_for_command',
                format('attempt %s needs a runner that runs %s, and no live runner of pool %s does '
                       '(%s)%s', a.number, v_cmd, a.pool,
                       (SELECT string_agg(format('%s runs %s', e->>'runner',
                                                 coalesce(array_to_string(ARRAY(SELECT jsonb_array_elements_text(e->'commands')), ', '), 'everything')), '; ')
                        FROM jsonb_array_elements(v_live) e),
                       CASE WHEN v_cmd = 'sync' THEN ': a runner runs syncs with --store' ELSE '' END),
                jsonb_build_object('pool', a.pool, 'command', v_cmd, 'runners', v_live),
                a.created_at, NULL::timestamptz;
        ELSE
            SELECT count(*) INTO v_running FROM orca.leases x JOIN orca.attempts y ON y.id = x.attempt_id
            WHERE x.org_id = v_org AND y.pool = a.pool;
            RETURN QUERY SELECT 'waiting_for_runner',
                format('attempt %s waits in pool %s behind %s older attempt%s; %s live runner%s '
                       'with %s slot%s, %s attempt%s running there',
                       a.number, a.pool, v_ahead, CASE WHEN v_ahead = 1 THEN '' ELSE 's' END,
                       v_n, CASE WHEN v_n = 1 THEN '' ELSE 's' END,
                       coalesce(v_slots::text, 'unknown'), CASE WHEN v_slots = 1 THEN '' ELSE 's' END,
                       v_running, CASE WHEN v_running = 1 THEN '' ELSE 's' END),
                jsonb_build_object('pool', a.pool, 'ahead', v_ahead, 'runners', v_live),
                a.created_at, NULL::timestamptz;
        END IF;
    ELSIF a.status = 'leased' THEN
        SELECT * INTO l FROM orca.leases x WHERE x.attempt_id = a.id;
        IF l.deadline < now() THEN
            RETURN QUERY SELECT 'lease_lapsed',
                format('attempt %s''s lease on runner %s lapsed at %s without a heartbeat: the next '
                       'orca.tick hands the run on', a.number, l.runner, l.deadline),
                jsonb_build_object('attempt', a.number, 'runner', l.runner),
                l.deadline, NULL::timestamptz;
        ELSE
            RETURN QUERY SELECT 'running',
                format('attempt %s runs on runner %s since %s (last heartbeat %s)', a.number,
                       l.runner, a.leased_at, l.heartbeat_at),
                jsonb_build_object('attempt', a.number, 'runner', l.runner),
                a.leased_at, l.deadline;
        END IF;
        IF p.paused THEN
            RETURN QUERY SELECT 'paused',
                format('pipeline %s is paused (by %s): the running attempt goes on, and a step that '
                       'follows a job elsewhere (orca::flink) stops it at a resume point and waits',
                       p.name, coalesce(v_by, 'someone')),
                jsonb_build_object('by', v_by), v_at, NULL::timestamptz;
        END IF;
        -- A driver waiting for its tasks: those queued, and retries in backoff.
        IF r.has_tasks THEN
            SELECT count(*) FILTER (WHERE x.status = 'queued') AS queued,
                   count(*) FILTER (WHERE x.status = 'leased') AS leased,
                   min(x.not_before) FILTER (WHERE x.status = 'queued' AND x.not_before > now()) AS backoff,
                   min(x.pool) AS pool
            INTO t FROM orca.task_batches x WHERE x.run_id = r.id;
            IF t.queued > 0 OR t.leased > 0 THEN
                RETURN QUERY SELECT 'waiting_for_tasks',
                    format('its step waits for tasks: %s batch%s queued in pool %s, %s running%s',
                           t.queued, CASE WHEN t.queued = 1 THEN '' ELSE 'es' END, t.pool, t.leased,
                           CASE WHEN t.backoff IS NOT NULL
                                THEN format('; retries wait for their backoff until %s', t.backoff)
                                ELSE '' END),
                    jsonb_build_object('queued_batches', t.queued, 'running_batches', t.leased,
                                       'pool', t.pool),
                    a.leased_at, t.backoff;
            END IF;
        END IF;
    ELSIF r.kind = 'sense' THEN
        -- A sensor's polling run stays running; its polls come and go.
        RETURN QUERY SELECT 'sensing',
            format('sensor %s polls for new snapshots of the datasets it watches; its last poll '
                   '(attempt %s) ended %s at %s, and orca.tick queues the next when it is due',
                   p.name, a.number, a.status, a.finished_at),
            NULL::jsonb, a.finished_at, NULL::timestamptz;
    END IF;
END
$$;
COMMENT ON FUNCTION orca.explain(bigint) IS
'Why a run of the session''s org is not running or not finished, as rows (code, message, '
'blocked_by, since, until), from the same rows and helpers that orca.claim, orca.tick and the '
'start of queued runs decide with. Codes: finished, restart_backoff, paused, max_runs, starting, '
'no_live_runner, no_runner_for_command, waiting_for_runner, running, lease_lapsed, '
'waiting_for_tasks, sensing, and the history lease_reclaimed and handed_back. Errors: OR011 unknown run. '
'Example: SELECT code, message FROM orca.explain(42);';
