-- Datasets: pinned reads, recorded commits, lineage, and the refusal of
-- cycles across pipelines.

-- The live attempt a lease holds, with the (step, partition) and the dataset
-- checked against the run and the step's declaration.
CREATE FUNCTION orca._dataset_access(p_org bigint, p_lease uuid, p_step text, p_partition text,
                                     p_dataset text, p_mode text)
RETURNS orca.attempts
LANGUAGE plpgsql AS $$
DECLARE
    a orca.attempts;
BEGIN
    SELECT x.* INTO a FROM orca.leases l JOIN orca.attempts x ON x.id = l.attempt_id
    WHERE l.attempt_id = orca._lease_attempt(p_lease) AND l.lease = p_lease AND l.org_id = p_org;
    IF NOT FOUND THEN
        PERFORM orca._lease_refused(p_org, p_lease);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM orca.step_states s
                   WHERE s.run_id = a.run_id AND s.step = p_step AND s.partition = p_partition) THEN
        RAISE EXCEPTION 'run % has no step % for partition %', a.run_id, quote_nullable(p_step),
            quote_nullable(p_partition) USING ERRCODE = 'OR016';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM orca.step_datasets d
                   WHERE d.version_id = a.version_id AND d.step = p_step
                     AND d.dataset = p_dataset AND d.mode = p_mode) THEN
        RAISE EXCEPTION 'step % does not declare dataset % in its %', p_step,
            quote_nullable(p_dataset), CASE p_mode WHEN 'read' THEN 'reads' ELSE 'writes' END
            USING ERRCODE = 'OR017',
                  HINT = 'declare it in the step: #[orca::step(..., reads = [...], writes = [...])]';
    END IF;
    RETURN a;
END
$$;

CREATE FUNCTION orca.pin_read(lease uuid, step text, partition text, dataset text, snapshot bigint)
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

CREATE FUNCTION orca.record_commit(lease uuid, step text, partition text, dataset text,
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

CREATE FUNCTION orca.lineage(dataset text)
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
