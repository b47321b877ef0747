-- Dispatch: runners claim attempts, heartbeat their leases and finish
-- them; pipeline binaries report their steps under a lease.
--
-- Lock order, to keep concurrent calls free of deadlocks: a pipeline row, then
-- a run row, then its attempts. orca.claim and orca.heartbeat lock only
-- attempts and never wait for a run.

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
    IF r.kind = 'sense' THEN
        -- A sensor's polls come and go; its sense run stays as it is. A
        -- poll that could not read its sources is an incident.
        PERFORM orca._sense_incident(r, p_outcome, p_error);
        RETURN r.status;
    END IF;
    IF r.status <> 'running' THEN
        RETURN r.status;
    END IF;
    IF p_outcome = 'released' THEN
        -- Handing work back is not the run's fault: its budgets stay as they are.
        PERFORM orca._next_attempt(r.id, 'released');
        RETURN 'running';
    END IF;
    IF p_outcome = 'failed' AND a.killed_for = 'memory'
       AND (a.resources->>'memory_bytes')::bigint
           < (SELECT (v.manifest->'resources'->>'max_memory_bytes')::bigint
              FROM orca.pipeline_versions v WHERE v.id = a.version_id) THEN
        -- Killed for memory below its cap: the next attempt gets more
        -- (orca._attempt_size), and the run's retries stay as they are.
        PERFORM orca._next_attempt(r.id, 'killed for memory');
        RETURN 'running';
    END IF;
    IF p_outcome = 'succeeded' THEN
        UPDATE orca.runs SET status = 'succeeded', finished_at = now(), error = NULL
        WHERE id = r.id;
        PERFORM orca._event(r.org_id, 'run.succeeded', r.pipeline_id, r.id, a.id,
                            jsonb_build_object('attempts', r.attempts));
        PERFORM orca._slot_freed(r.org_id, r.pipeline_id);
        -- A success resolves its run's incident: one probe of the open
        -- incidents, and the resolution only when the org has one.
        IF EXISTS (SELECT 1 FROM orca.incidents i
                   WHERE i.org_id = r.org_id AND i.resolved_at IS NULL) THEN
            PERFORM orca._run_incident(r, 'succeeded', NULL);
        END IF;
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
    -- Retries spent: an incident, and the org's playbooks for it.
    PERFORM orca._run_incident(r, 'failed', (SELECT x.error FROM orca.runs x WHERE x.id = r.id));
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

CREATE FUNCTION orca.register_runner(name text, pool text DEFAULT 'default',
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
                     AND rn.commands IS NOT DISTINCT FROM claim.commands
                     AND rn.last_seen >= now() - interval '1 second') THEN
        INSERT INTO orca.runners AS rn (org_id, name, pool, commands)
        VALUES (v_org, claim.runner, claim.pool, claim.commands)
        ON CONFLICT (org_id, name) DO UPDATE
            SET last_seen = now(), pool = excluded.pool, commands = excluded.commands
        WHERE rn.last_seen < now() - interval '1 second' OR rn.pool <> excluded.pool
           OR rn.commands IS DISTINCT FROM excluded.commands;
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
        RETURNING a.id, a.run_id, a.lease, a.version_id, a.number, a.deadline, a.pool, a.resources
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
                   v.registry_hash, r.kind AS run_kind, v.binary_sha256, v.image
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
           CASE WHEN i.run_kind IN ('sync', 'discover', 'maintain') THEN NULL ELSE i.binary_sha256 END,
           i.resources, i.image
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

CREATE FUNCTION orca.heartbeat(lease uuid) RETURNS timestamptz
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

CREATE FUNCTION orca.finish(lease uuid, ok boolean, error text DEFAULT NULL,
                            killed_for text DEFAULT NULL) RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('finish', 'error', octet_length(finish.error), 65536)
                         AND orca._bound('finish', 'killed_for', octet_length(finish.killed_for), 1024);
    t     orca.runner_tokens := orca._runner_session();
    v_org bigint := t.org_id;
    a     orca.attempts;
BEGIN
    IF finish.ok IS NULL THEN
        RAISE EXCEPTION 'ok must be true or false, got NULL' USING ERRCODE = 'OR050';
    END IF;
    IF finish.killed_for IS NOT NULL AND (finish.ok OR finish.killed_for <> 'memory') THEN
        RAISE EXCEPTION 'killed_for must be NULL or, for a failed attempt, ''memory'', got %',
                        quote_literal(finish.killed_for)
            USING ERRCODE = 'OR050';
    END IF;
    PERFORM orca._lease_holder(t, finish.lease);
    a := orca._leased_attempt(v_org, finish.lease);
    IF finish.killed_for IS NOT NULL THEN
        UPDATE orca.attempts SET killed_for = finish.killed_for WHERE id = a.id;
    END IF;
    -- The control plane restarted while the attempt ran: what failed it is
    -- most likely the restart (its sessions ended with 57P01, a commit's
    -- answer was lost), not its work. Handed back, it spends no retry.
    IF NOT finish.ok AND finish.killed_for IS NULL AND a.leased_at < pg_postmaster_start_time() THEN
        RETURN orca._hand_back(a, format(
            'the control plane restarted at %s while the attempt ran; it failed with: %s',
            pg_postmaster_start_time(),
            coalesce(finish.error, 'the attempt failed without a message')));
    END IF;
    RETURN orca._attempt_ended(
        a.id,
        CASE WHEN finish.ok THEN 'succeeded' ELSE 'failed' END,
        CASE WHEN finish.ok THEN NULL
             ELSE coalesce(finish.error, 'the attempt failed without a message') END);
END
$$;
COMMENT ON FUNCTION orca.finish(uuid, boolean, text, text) IS
'Ends a leased attempt: ok => true marks the run succeeded; ok => false records the error and '
'retries the run while its run_retries last, else fails it. killed_for => ''memory'' (the '
'attempt was killed for memory: OOMKilled, or its runner''s memory limit) retries it with more '
'memory (its version''s memory_growth, up to max_memory) without spending run_retries; at the '
'cap it is an ordinary failure. A failure of an attempt leased before the control plane last '
'restarted is handed back instead, as orca.release does: the restart, not the work, most '
'likely failed it, and the run''s retries stay as they are. Returns the run''s status '
'afterwards (succeeded, running when retried or handed back, failed). A stale or foreign '
'lease gets OR012, OR014 or OR015 and changes nothing.';

CREATE FUNCTION orca.finish_many(leases uuid[], ok boolean DEFAULT true, error text DEFAULT NULL)
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

-- How many times a run was handed back in the last 10 minutes: at 10,
-- orca.release fails the next one instead (a loop), and orca.explain warns.
CREATE FUNCTION orca._handed_back(p_run bigint) RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT count(*)::integer FROM orca.attempts x
    WHERE x.run_id = p_run AND x.status = 'released'
      AND x.finished_at > now() - interval '10 minutes'
$$;

-- Runners seen since this are live: a runner claims every few seconds,
-- so one not seen for five minutes is gone. orca.pool_load counts them,
-- orca.explain names the pools that have none.
CREATE FUNCTION orca._runner_live_since(p_now timestamptz DEFAULT now()) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT p_now - interval '5 minutes'
$$;

-- Hands a leased attempt (locked by the caller) back: the run gets a new
-- attempt and spends no budget. A run handed back again and again (an
-- engine that asks for a new attempt each time it starts, a runner
-- restarting in a loop) would go round with no pause and no end: past a
-- bound the attempt fails, and the run's retries (and a continuous sync's
-- backoff) take over. Returns the run's status afterwards.
CREATE FUNCTION orca._hand_back(a orca.attempts, p_why text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_recent integer := orca._handed_back(a.run_id);
BEGIN
    IF v_recent >= 10 THEN
        RETURN orca._attempt_ended(a.id, 'failed',
            format('handed back %s times in 10 minutes; the last time: %s', v_recent + 1, p_why));
    END IF;
    RETURN orca._attempt_ended(a.id, 'released', p_why);
END
$$;

CREATE FUNCTION orca.release(lease uuid, reason text DEFAULT NULL) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('release', 'reason', octet_length(release.reason), 65536);
    t     orca.runner_tokens := orca._runner_session();
    v_org bigint := t.org_id;
    a     orca.attempts;
    v_why text := coalesce(release.reason, 'released by its runner');
BEGIN
    PERFORM orca._lease_holder(t, release.lease);
    a := orca._leased_attempt(v_org, release.lease);
    PERFORM orca._hand_back(a, v_why);
END
$$;
COMMENT ON FUNCTION orca.release(uuid, text) IS
'Hands a leased attempt back unfinished, for a runner that is shutting down, an engine that '
'asks for a new attempt (a continuous sync meeting a new table shape), or an engine or pipeline '
'binary whose object store did not answer: the run gets a new '
'pending attempt at once, and neither run_retries nor the lost-attempt budget is spent. A run '
'handed back 10 times in 10 minutes is in a loop: the 11th attempt fails instead (its error '
'says so), and the run''s retries decide. Errors: OR012/OR014/OR015 for the lease.';

CREATE FUNCTION orca.report_step(lease uuid, step text, partition text, status text,
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

CREATE FUNCTION orca.attempt_context(lease uuid, build jsonb DEFAULT '{}') RETURNS jsonb
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
