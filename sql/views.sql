-- Views for people and BI tools. security_invoker makes row-level security
-- apply to the reader, so a view shows only the session's org.

CREATE VIEW orca.run_overview WITH (security_invoker = true) AS
SELECT r.id                            AS run,
       o.name                          AS org,
       p.name                          AS pipeline,
       v.version,
       v.registry_hash,
       r.partitions,
       r.trigger,
       r.kind,
       r.parent_run,
       r.status,
       r.fire_at,
       r.attempts,
       r.failures,
       r.losses,
       r.error,
       r.created_at,
       r.started_at,
       r.finished_at,
       r.finished_at - r.started_at   AS duration,
       (SELECT count(*) FROM orca.step_states s
        WHERE s.run_id = r.id AND s.status = 'succeeded') AS steps_succeeded,
       (SELECT count(*) FROM orca.step_states s WHERE s.run_id = r.id) AS steps_total
FROM orca.runs r
JOIN orca.orgs o ON o.id = r.org_id
JOIN orca.pipelines p ON p.id = r.pipeline_id
JOIN orca.pipeline_versions v ON v.id = r.version_id;
COMMENT ON VIEW orca.run_overview IS
'One row per run with its pipeline, version, status, timings and step progress.';

CREATE VIEW orca.attempt_overview WITH (security_invoker = true) AS
SELECT a.id                         AS attempt,
       a.run_id                     AS run,
       o.name                       AS org,
       p.name                       AS pipeline,
       a.number,
       a.status,
       a.pool,
       a.runner,
       a.created_at,
       a.leased_at,
       coalesce(l.heartbeat_at, a.heartbeat_at) AS heartbeat_at,
       coalesce(l.deadline, a.deadline) AS deadline,
       a.finished_at,
       a.leased_at - a.created_at   AS waited,
       a.finished_at - a.leased_at  AS duration,
       a.error
FROM orca.attempts a
LEFT JOIN orca.leases l ON l.attempt_id = a.id
JOIN orca.orgs o ON o.id = a.org_id
JOIN orca.runs r ON r.id = a.run_id
JOIN orca.pipelines p ON p.id = r.pipeline_id;
COMMENT ON VIEW orca.attempt_overview IS
'One row per attempt: which runner held it, how long it waited for one and how long it ran.';

CREATE VIEW orca.pipeline_overview WITH (security_invoker = true) AS
SELECT p.id                 AS pipeline_id,
       o.name               AS org,
       p.name               AS pipeline,
       v.version,
       v.registry_hash,
       v.partition_kind,
       v.partition_start,
       v.keys_dataset,
       v.keys_column,
       v.keys_per_run,
       p.keys_snapshot,
       p.keys_read_at,
       (SELECT count(*) FROM orca.keys k
        WHERE k.pipeline_id = p.id AND k.generation = p.keys_generation) AS keys,
       s.cron,
       s.tz,
       s.fills,
       s.catchup,
       s.last_fire_at,
       p.max_runs,
       p.paused,
       v.binary_path,
       v.commit,
       v.registered_at,
       (SELECT count(*) FROM orca.runs r WHERE r.pipeline_id = p.id AND r.status = 'queued')  AS queued,
       (SELECT count(*) FROM orca.runs r WHERE r.pipeline_id = p.id AND r.status = 'running') AS running,
       (SELECT max(r.finished_at) FROM orca.runs r WHERE r.pipeline_id = p.id)                AS last_finished_at
FROM orca.pipelines p
JOIN orca.orgs o ON o.id = p.org_id
JOIN orca.pipeline_versions v ON v.id = p.current_version
LEFT JOIN orca.schedules s ON s.pipeline_id = p.id;
COMMENT ON VIEW orca.pipeline_overview IS
'One row per pipeline: its current version, schedule and how many runs are queued or running.';

CREATE VIEW orca.sync_overview WITH (security_invoker = true) AS
SELECT sy.id                                        AS sync_id,
       o.name                                       AS org,
       sy.name                                      AS sync,
       sy.delivery,
       sy.definition->'source'->>'type'             AS source,
       sy.definition->'destination'->>'type'        AS destination,
       jsonb_array_length(sy.definition->'streams') AS streams,
       sy.definition->>'schedule'                   AS schedule,
       v.pool,
       sy.generation,
       sy.head_epoch,
       sy.head_at,
       last.id                                      AS last_run,
       last.status                                  AS last_status,
       last.trigger                                 AS last_trigger,
       last.finished_at                             AS last_finished_at,
       last.error                                   AS last_error,
       (SELECT count(*) FROM orca.runs r WHERE r.pipeline_id = p.id AND r.status = 'queued')  AS queued,
       (SELECT count(*) FROM orca.runs r WHERE r.pipeline_id = p.id AND r.status = 'running') AS running
FROM orca.syncs sy
JOIN orca.orgs o ON o.id = sy.org_id
LEFT JOIN orca.pipelines p ON p.org_id = sy.org_id AND p.name = sy.name
LEFT JOIN orca.pipeline_versions v ON v.id = p.current_version
LEFT JOIN LATERAL (
    SELECT r.id, r.status, r.trigger, r.finished_at, r.error FROM orca.runs r
    WHERE r.pipeline_id = p.id AND r.kind = 'sync'
    ORDER BY r.id DESC LIMIT 1
) last ON true;
COMMENT ON VIEW orca.sync_overview IS
'One row per sync: delivery, source and destination, schedule and pool, the checkpoint log''s '
'HEAD (generation, epoch, when it moved), its last run and how many are queued or running.';

CREATE VIEW orca.event_log WITH (security_invoker = true) AS
SELECT e.id, e.at, o.name AS org, e.kind, p.name AS pipeline, e.run_id AS run,
       e.attempt_id AS attempt, e.data
FROM orca.events e
JOIN orca.orgs o ON o.id = e.org_id
LEFT JOIN orca.pipelines p ON p.id = e.pipeline_id;
COMMENT ON VIEW orca.event_log IS
'The outbox with names: every state change, in order. Consumers follow it by id.';
