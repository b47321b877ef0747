-- Discovery: a source's catalog (its tables, columns, types, keys, whether
-- a change stream can read each), read by a runner's orca-engine because the
-- control plane reads no source, kept in versions, planned from by
-- orca.create_sync, and checked against by each attempt of the sync (drift).

-- A catalog is named for the sync it is (or will be) of. Versions count up
-- each time a discovery finds the source changed.
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

-- What makes a catalog a new version: everything but the row estimates,
-- which move with every write.
CREATE FUNCTION orca._catalog_shape(p_catalog jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_catalog || jsonb_build_object('streams', coalesce(
        (SELECT jsonb_agg(s - 'rows_estimate' ORDER BY o)
         FROM jsonb_array_elements(CASE jsonb_typeof(p_catalog->'streams')
                                        WHEN 'array' THEN p_catalog->'streams' ELSE '[]' END)
              WITH ORDINALITY AS x(s, o)), '[]'::jsonb))
$$;

-- What names the place a source reads, without how it reads it (batch
-- rows, splits, continuous...): a catalog plans for any sync of the same.
CREATE FUNCTION orca._source_identity(p_source jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_strip_nulls(jsonb_build_object('type', p_source->'type', 'url', p_source->'url',
                                                'connector', p_source->'connector',
                                                'config', p_source->'config'))
$$;

-- The newest version of a catalog, or NULL.
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

-- The live lease of a discovery task's attempt, and its run.
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

-- The streams of a catalog's plan that orca.create_sync was asked for:
-- {"catalog": true} takes every one, {"catalog": ["public.orders", ...]}
-- those tables'.
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
