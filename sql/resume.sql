-- Long-running steps: what the control plane asks of a running attempt
-- (go on, stop for a pause, stop for a cancel), and where a step's work
-- resumes (a Flink job's savepoint). A step that hands its work to a
-- cluster asks orca.attempt_state between looks at its job; the resume
-- point outlives the run, so the next run of the same (pipeline, step,
-- partition) starts where the last one stopped.

CREATE TABLE orca.resume_points (
    org_id      bigint NOT NULL,
    pipeline_id bigint NOT NULL,
    step        text NOT NULL,
    partition   text NOT NULL,
    -- Where the work resumes: for a Flink job, its savepoint's directory.
    location    text NOT NULL,
    -- Who recorded it: a later attempt's record replaces an earlier one's,
    -- never the other way round.
    run_id      bigint NOT NULL,
    attempt_id  bigint NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pipeline_id, step, partition),
    FOREIGN KEY (org_id, pipeline_id) REFERENCES orca.pipelines (org_id, id) ON DELETE CASCADE
);
COMMENT ON TABLE orca.resume_points IS
'Where a (pipeline, step, partition)''s long-running work resumes (a Flink job''s savepoint), '
'kept across runs: recorded by the step when it stops its job (pause, cancel, its attempt '
'killed), read by the next attempt of any run.';
ALTER TABLE orca.resume_points ENABLE ROW LEVEL SECURITY;
CREATE POLICY org_scope ON orca.resume_points USING (org_id = (SELECT orca.current_org_id()));
SELECT pg_catalog.pg_extension_config_dump('orca.resume_points', '');

CREATE FUNCTION orca.attempt_state(lease uuid) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_org    bigint := orca._lease_org(attempt_state.lease);
    a        orca.attempts;
    v_paused boolean;
BEGIN
    SELECT x.* INTO a FROM orca.attempts x
    WHERE x.id = orca._lease_attempt(attempt_state.lease) AND x.lease = attempt_state.lease
      AND x.org_id = v_org;
    IF a.status = 'cancelled' THEN
        RETURN 'cancelled';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM orca.leases l
                   WHERE l.attempt_id = a.id AND l.lease = attempt_state.lease) THEN
        RETURN 'ended';
    END IF;
    SELECT p.paused INTO v_paused
    FROM orca.runs r JOIN orca.pipelines p ON p.id = r.pipeline_id
    WHERE r.id = a.run_id;
    RETURN CASE WHEN v_paused THEN 'paused' ELSE 'running' END;
END
$$;
COMMENT ON FUNCTION orca.attempt_state(uuid) IS
'What the control plane asks of the attempt a lease was given for: running (go on), paused '
'(its pipeline is paused: a long-running step stops its job at a resume point and waits), '
'cancelled (its run was cancelled: stop) or ended (the lease is no longer live: lost, '
'finished or handed back). Asked by steps that follow work on a cluster (orca::flink). '
'Errors: OR012 unknown lease.';

-- The attempt a lease was given for, for the resume point functions: a
-- live lease, or the lease of an attempt that was cancelled or lost in the
-- last hour (a step that stops its job when its run is cancelled, or a
-- guard that stops it when the step was killed, records where it stopped
-- after the lease was taken back). The step and partition must be the
-- run's.
CREATE FUNCTION orca._resume_attempt(p_org bigint, p_lease uuid, p_step text, p_partition text)
RETURNS orca.attempts
LANGUAGE plpgsql AS $$
DECLARE
    a orca.attempts;
BEGIN
    SELECT x.* INTO a FROM orca.attempts x
    WHERE x.id = orca._lease_attempt(p_lease) AND x.lease = p_lease AND x.org_id = p_org;
    IF NOT EXISTS (SELECT 1 FROM orca.leases l WHERE l.attempt_id = a.id AND l.lease = p_lease)
       AND NOT (a.status IN ('cancelled', 'lost') AND a.finished_at > now() - interval '1 hour') THEN
        PERFORM orca._lease_refused(p_org, p_lease);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM orca.step_states s
                   WHERE s.run_id = a.run_id AND s.step = p_step AND s.partition = p_partition) THEN
        RAISE EXCEPTION 'run % has no step % for partition %', a.run_id, quote_nullable(p_step),
            quote_nullable(p_partition) USING ERRCODE = 'OR016';
    END IF;
    RETURN a;
END
$$;

CREATE FUNCTION orca.resume_point(lease uuid, step text, partition text) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('resume_point', 'step', octet_length(resume_point.step), 1024)
                         AND orca._bound('resume_point', 'partition', octet_length(resume_point.partition), 1024);
    v_org bigint := orca._lease_org(resume_point.lease);
    a     orca.attempts;
BEGIN
    a := orca._resume_attempt(v_org, resume_point.lease, resume_point.step, resume_point.partition);
    RETURN (SELECT p.location FROM orca.resume_points p
            JOIN orca.runs r ON r.pipeline_id = p.pipeline_id
            WHERE r.id = a.run_id AND p.org_id = v_org
              AND p.step = resume_point.step AND p.partition = resume_point.partition);
END
$$;
COMMENT ON FUNCTION orca.resume_point(uuid, text, text) IS
'Where a (step, partition) of the leased run''s pipeline resumes (a Flink savepoint), as the '
'last run that stopped it recorded; NULL when nothing was recorded or the work finished. '
'Errors: OR012/OR014/OR015 for the lease, OR016 unknown step or partition.';

CREATE FUNCTION orca.record_resume_point(lease uuid, step text, partition text, location text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('record_resume_point', 'step', octet_length(record_resume_point.step), 1024)
                         AND orca._bound('record_resume_point', 'partition', octet_length(record_resume_point.partition), 1024)
                         AND orca._bound('record_resume_point', 'location', octet_length(record_resume_point.location), 4096);
    v_org      bigint := orca._lease_org(record_resume_point.lease);
    a          orca.attempts;
    v_pipeline bigint;
    v_n        integer;
    v_loc      text := record_resume_point.location;
BEGIN
    a := orca._resume_attempt(v_org, record_resume_point.lease, record_resume_point.step,
                              record_resume_point.partition);
    IF v_loc IS NOT NULL AND (v_loc = '' OR v_loc ~ '[[:cntrl:]]'
                              OR v_loc ~ '(^|/)\.\.(/|$)') THEN
        RAISE EXCEPTION 'resume point %: a location must be a path or URL without control '
                        'characters or ''..'' segments', quote_literal(v_loc)
            USING ERRCODE = 'OR104';
    END IF;
    SELECT r.pipeline_id INTO v_pipeline FROM orca.runs r WHERE r.id = a.run_id;
    IF v_loc IS NULL THEN
        DELETE FROM orca.resume_points p
        WHERE p.pipeline_id = v_pipeline AND p.step = record_resume_point.step
          AND p.partition = record_resume_point.partition AND p.attempt_id <= a.id;
    ELSE
        INSERT INTO orca.resume_points AS p
            (org_id, pipeline_id, step, partition, location, run_id, attempt_id)
        VALUES (v_org, v_pipeline, record_resume_point.step, record_resume_point.partition,
                v_loc, a.run_id, a.id)
        ON CONFLICT (pipeline_id, step, partition) DO UPDATE
            SET location = EXCLUDED.location, run_id = EXCLUDED.run_id,
                attempt_id = EXCLUDED.attempt_id, recorded_at = now()
            WHERE p.attempt_id <= EXCLUDED.attempt_id;
    END IF;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    IF v_n > 0 THEN
        PERFORM orca._event(v_org, 'step.resume_point', v_pipeline, a.run_id, a.id,
            jsonb_build_object('step', record_resume_point.step,
                               'partition', record_resume_point.partition,
                               'location', v_loc));
    END IF;
    RETURN v_n > 0;
END
$$;
COMMENT ON FUNCTION orca.record_resume_point(uuid, text, text, text) IS
'Records where a (step, partition) of the leased run''s pipeline resumes (a Flink savepoint; '
'NULL forgets it: the work finished). Allowed for a live lease, and for an hour after its '
'attempt was cancelled or lost (the step, or the guard of its job, stops the job after the '
'lease was taken back); a later attempt''s record is never replaced by an earlier one''s '
'(returns false then). Emits step.resume_point. Errors: OR012/OR014/OR015 for the lease, '
'OR016 unknown step or partition, OR104 a location with control characters or ''..''.';
