-- Keyed pipelines: partitioned by the distinct values of a column in a
-- dataset. A keys task reads them; runs cover keys_per_run keys each.

-- A key is what orca._valid_key says (orca_core::keyed, the one rule for
-- keys everywhere): 1 to 128 bytes of letters, digits and ._:-.
ALTER TABLE orca.keys ADD CONSTRAINT keys_key_check CHECK (orca._valid_key(key));

-- Queues a keys task: a run of kind 'keys' whose one attempt runs
-- `<binary> keys --lease`, reads the keys dataset's current snapshot and
-- reports its keys with orca.report_keys, which then acts on the request.
-- A request for every key ('all') or a plain read ('refresh') joins one of the
-- same mode and the same runs' size (per_run) that has not started reading
-- yet. Returns the task's run id.
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
          AND r.request->'per_run' IS NOT DISTINCT FROM p_request->'per_run'
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

-- Queues runs of at most p_per_run (default keys_per_run) keys each over
-- p_keys, in order, leaving out keys that already have a queued or running
-- run. Returns the run ids.
CREATE FUNCTION orca._queue_key_runs(p_org bigint, p_pipeline bigint, p_keys text[],
                                     p_trigger text, p_parent bigint,
                                     p_per_run integer DEFAULT NULL)
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
        SELECT (row_number() OVER (ORDER BY ord) - 1) / coalesce(p_per_run, v.keys_per_run) AS grp,
               key, ord
        FROM todo
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

CREATE FUNCTION orca.keys_context(lease uuid) RETURNS jsonb
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

CREATE FUNCTION orca.report_keys(lease uuid, snapshot bigint, snapshot_ms bigint, keys text[])
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
        v_runs := orca._queue_key_runs(v_org, p.id, v_todo, 'backfill', r.id,
                                       (r.request->>'per_run')::int);
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
'the task''s mode acts: all queues runs of keys_per_run (or the backfill''s per_run) for every key that is not done, new '
'for the keys this snapshot added. Returns {keys, new, stale, runs}. Errors: OR020 a value '
'that is not a key, OR012/OR014 a refused lease, OR050 a lease that is not a keys task.';

CREATE FUNCTION orca.refresh_keys(pipeline text) RETURNS bigint
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

CREATE FUNCTION orca.key_status(pipeline text)
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
