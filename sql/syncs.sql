-- Syncs: a source, a destination and streams, moved in epochs by
-- orca-engine. HEAD and the generation live here, so that committing an
-- epoch is a compare-and-swap and an older attempt is fenced.

-- Makes (or updates) the pipeline behind a sync: a version of partition kind
-- sync whose runs are the sync's attempts, one at a time, on its schedule.
CREATE FUNCTION orca._sync_pipeline(p_org bigint, p_name text, p_def jsonb, p_schedule text,
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

CREATE FUNCTION orca._sync(p_org bigint, p_name text) RETURNS orca.syncs
LANGUAGE plpgsql AS $$
DECLARE
    s orca.syncs;
BEGIN
    SELECT * INTO s FROM orca.syncs WHERE org_id = p_org AND name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown sync ''%'' in org ''%''', p_name,
                        (SELECT name FROM orca.orgs WHERE id = p_org)
            USING ERRCODE = 'OR064',
                  HINT = 'orca.syncs lists the defined syncs; orca.create_sync defines one';
    END IF;
    RETURN s;
END
$$;

-- The fence: only the attempt of the sync's current generation moves HEAD.
CREATE FUNCTION orca._owned(s orca.syncs, p_generation integer) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_generation <> s.generation THEN
        RAISE EXCEPTION 'attempt of generation % is fenced: sync ''%'' was claimed by generation %',
                        p_generation, s.name, s.generation
            USING ERRCODE = 'OR070',
                  HINT = 'a newer attempt owns the sync; this one must stop without committing';
    END IF;
END
$$;

-- The org a sync HEAD call acts in, and the attempt whose lease it came
-- with. HEAD moves only under the live lease of an attempt of the sync's own
-- run; admins may drive a sync by hand (repairs, tests) in their session's org.
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

-- A checkpoint record is an object of the sync's own prefix in the store,
-- `<org>/<sync>/_checkpoints/<name>`: HEAD never names another org's or
-- sync's object, nor one outside the store.
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

CREATE FUNCTION orca.create_sync(name text, source jsonb, destination jsonb, streams jsonb,
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

CREATE FUNCTION orca.claim_sync(sync text, lease uuid DEFAULT NULL) RETURNS jsonb
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
    -- HEAD moving is the report that a stalled sync goes on (one probe of
    -- the org's open incidents first: a commit is on the sync's hot path).
    IF EXISTS (SELECT 1 FROM orca.incidents i WHERE i.org_id = v_org AND i.resolved_at IS NULL) THEN
        PERFORM orca._incident_resolve(v_org, 'sync_stalled:' || s.id,
                                       format('HEAD moved to epoch %s', advance_head.epoch));
    END IF;
END
$$;
COMMENT ON FUNCTION orca.advance_head(text, integer, bigint, text, uuid) IS
'The commit point of an epoch: moves the sync''s HEAD to the checkpoint record of epoch '
'(HEAD epoch + 1), as a compare-and-swap under the row lock. An attempt whose generation is '
'no longer the sync''s gets OR070 (fenced) and changes nothing; an epoch out of order OR071. '
'The same commit again (same generation, epoch and record: a retry whose first answer was '
'lost) succeeds and changes nothing. lease: the live lease of the attempt (required except for '
'admins: OR084); record must be an object <org>/<sync>/_checkpoints/<name> (OR085).';

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
