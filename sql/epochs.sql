-- What each committed epoch of a sync moved: rows per stream, quarantined
-- and held files. The checkpoint record in the sync's store is the truth;
-- the engine copies these figures here right after HEAD moved, so that the
-- API, the console and BI tools see them without the store's credentials.

CREATE TABLE orca.sync_epochs (
    org_id       bigint NOT NULL,
    sync_id      bigint NOT NULL,
    epoch        bigint NOT NULL,
    generation   integer NOT NULL,
    -- {"<stream>": rows, ...}
    rows         jsonb NOT NULL DEFAULT '{}',
    total_rows   bigint NOT NULL DEFAULT 0,
    quarantined  integer NOT NULL DEFAULT 0,
    held         integer NOT NULL DEFAULT 0,
    committed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (sync_id, epoch),
    FOREIGN KEY (org_id, sync_id) REFERENCES orca.syncs (org_id, id) ON DELETE CASCADE
);
COMMENT ON TABLE orca.sync_epochs IS
'Each committed epoch of a sync, as its engine reported it after moving HEAD: rows per stream, '
'quarantined and held files. Pruned with orca.retain_runs.';
CREATE INDEX sync_epochs_committed ON orca.sync_epochs (committed_at);
ALTER TABLE orca.sync_epochs ENABLE ROW LEVEL SECURITY;
CREATE POLICY org_scope ON orca.sync_epochs USING (org_id = (SELECT orca.current_org_id()));
SELECT pg_catalog.pg_extension_config_dump('orca.sync_epochs', '');

CREATE FUNCTION orca.record_epoch(sync text, generation integer, epoch bigint, stats jsonb,
                                  lease uuid DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('record_epoch', 'sync', octet_length(record_epoch.sync), 1024)
                         AND orca._bound('record_epoch', 'stats', octet_length(record_epoch.stats::text), 1048576);
    v_org   bigint := (orca._sync_caller(record_epoch.sync, record_epoch.lease, 'recording an epoch of')).org_id;
    s       orca.syncs := orca._sync(v_org, record_epoch.sync);
    v_rows  jsonb := coalesce(record_epoch.stats->'rows', '{}');
    v_total bigint;
BEGIN
    IF record_epoch.generation IS NULL OR record_epoch.epoch IS NULL OR record_epoch.epoch < 1
       OR jsonb_typeof(record_epoch.stats) IS DISTINCT FROM 'object'
       OR jsonb_typeof(v_rows) <> 'object'
       OR EXISTS (SELECT 1 FROM jsonb_each(v_rows) x
                  WHERE jsonb_typeof(x.value) <> 'number' OR (x.value)::numeric < 0
                     OR (x.value)::numeric <> trunc((x.value)::numeric))
       OR coalesce(jsonb_typeof(record_epoch.stats->'quarantined'), 'number') <> 'number'
       OR coalesce(jsonb_typeof(record_epoch.stats->'held'), 'number') <> 'number' THEN
        RAISE EXCEPTION 'record_epoch needs a generation, an epoch of 1 or more and stats '
                        '{"rows": {"<stream>": n}, "quarantined": n, "held": n}, got %, %, %',
            coalesce(record_epoch.generation::text, 'NULL'), coalesce(record_epoch.epoch::text, 'NULL'),
            coalesce(record_epoch.stats::text, 'NULL')
            USING ERRCODE = 'OR050';
    END IF;
    PERFORM orca._owned(s, record_epoch.generation);
    IF record_epoch.epoch > s.head_epoch THEN
        RAISE EXCEPTION 'epoch % of sync ''%'' is not committed (HEAD is at epoch %)',
                        record_epoch.epoch, s.name, s.head_epoch
            USING ERRCODE = 'OR071',
                  HINT = 'record an epoch after orca.advance_head moved HEAD to it';
    END IF;
    SELECT coalesce(sum((x.value)::numeric), 0)::bigint INTO v_total FROM jsonb_each(v_rows) x;
    INSERT INTO orca.sync_epochs AS e (org_id, sync_id, epoch, generation, rows, total_rows,
                                       quarantined, held)
    VALUES (s.org_id, s.id, record_epoch.epoch, record_epoch.generation, v_rows, v_total,
            greatest(0, coalesce((record_epoch.stats->>'quarantined')::numeric, 0))::int,
            greatest(0, coalesce((record_epoch.stats->>'held')::numeric, 0))::int)
    ON CONFLICT (sync_id, epoch) DO UPDATE
    SET generation = excluded.generation, rows = excluded.rows, total_rows = excluded.total_rows,
        quarantined = excluded.quarantined, held = excluded.held, committed_at = now();
END
$$;
COMMENT ON FUNCTION orca.record_epoch(text, integer, bigint, jsonb, uuid) IS
'For engines, under the sync run''s lease: records what a committed epoch moved '
'(stats {"rows": {"<stream>": n}, "quarantined": n, "held": n}) in orca.sync_epochs. '
'Errors: OR050 bad stats, OR070 fenced (not the sync''s generation), OR071 the epoch is not '
'committed yet, OR084 no lease.';
