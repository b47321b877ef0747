-- Who may do what. Permissions come from four group roles; which org a role
-- acts in comes from orca.members. Nothing is granted to PUBLIC.
--   orca_viewer   reads tables and views of its orgs, orca.fires
--   orca_operator + registers pipelines, queues, cancels and retries runs, ticks
--   orca_attempt  what a lease token allows: report steps, pin reads, record
--                 commits, move a sync's HEAD (a runner's children)
--   orca_runner   + claims, heartbeats and finishes attempts (with a runner
--                 token unless admin), ticks
--   orca_admin    + both, creates orgs and manages members, sees every org

REVOKE ALL ON SCHEMA orca FROM PUBLIC;
GRANT USAGE ON SCHEMA orca TO orca_viewer, orca_runner, orca_attempt, orca_relay;

REVOKE ALL ON ALL TABLES IN SCHEMA orca FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA orca FROM PUBLIC;
GRANT SELECT ON ALL TABLES IN SCHEMA orca TO orca_viewer;

-- Secrets stay with their holders: a lease token is the capability of an
-- attempt, and a runner token's hash is the runner's. Viewers read every
-- other column.
REVOKE SELECT ON orca.attempts, orca.leases, orca.runner_tokens, orca.secrets, orca.org_keys,
                 orca.api_keys, orca.webhooks, orca.task_batches, orca.task_leases
    FROM orca_viewer;
GRANT SELECT (org_id, id, url, events, description, cursor, enabled, disabled_reason,
              failing_since, failures, next_attempt_at, created_at, created_by, rotated_at)
    ON orca.webhooks TO orca_viewer;
GRANT SELECT (org_id, id, name, role, created_at, created_by, revoked_at)
    ON orca.api_keys TO orca_viewer;
GRANT SELECT (org_id, name, created_at, created_by, updated_at, updated_by)
    ON orca.secrets TO orca_viewer;
GRANT SELECT (org_id, created_at, rewrapped_at) ON orca.org_keys TO orca_viewer;
GRANT SELECT (org_id, id, run_id, version_id, number, status, runner, pool, created_at,
              leased_at, heartbeat_at, deadline, finished_at, error, build, resources,
              killed_for)
    ON orca.attempts TO orca_viewer;
GRANT SELECT (org_id, attempt_id, runner, deadline, heartbeat_at, token_id)
    ON orca.leases TO orca_viewer;
GRANT SELECT (org_id, id, name, pool, previous_until, created_at, created_by, rotated_at,
              revoked_at)
    ON orca.runner_tokens TO orca_viewer;
GRANT SELECT (org_id, id, run_id, step, partition, task, version_id, pool, indexes, inputs, try,
              max_tries, backoff_ms, status, not_before, created_at, runner, leased_at,
              heartbeat_at, deadline, finished_at, outcomes, outputs, errors, millis, finished_seq)
    ON orca.task_batches TO orca_viewer;
GRANT SELECT (org_id, batch_id, runner, deadline, heartbeat_at, token_id)
    ON orca.task_leases TO orca_viewer;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA orca FROM PUBLIC;
-- Row-level security policies call these as the reading role.
GRANT EXECUTE ON FUNCTION orca.current_org_id(), orca._may_use_org(bigint),
    orca._catalog_visible(text)
    TO orca_viewer, orca_runner, orca_attempt;
GRANT EXECUTE ON FUNCTION orca.fires(text, integer, timestamptz), orca.lineage(text),
    orca.key_status(text), orca.api_session(), orca.metrics(), orca.retention(),
    orca.pool_load(), orca.pool_backlog(text, text), orca.explain(bigint)
    TO orca_viewer;
GRANT EXECUTE ON FUNCTION
    orca.register(jsonb),
    orca.run(text, text),
    orca.backfill(text, text, integer),
    orca.cancel(bigint),
    orca.retry(bigint),
    orca.pause(text),
    orca.unpause(text),
    orca.refresh_keys(text),
    orca.create_sync(text, jsonb, jsonb, jsonb, text, text, text, integer),
    orca.discover(text, jsonb),
    orca.drop_sync(text),
    orca.pause_sync(text),
    orca.resume_sync(text),
    orca.scale_sync(text, integer),
    orca.maintain(text, jsonb),
    orca.schedule_maintenance(text, text, jsonb, text),
    orca.unschedule_maintenance(text),
    orca.create_runner_token(text, text),
    orca.revoke_runner_token(text),
    orca.rotate_runner_token(text, interval),
    orca.create_api_key(text, text),
    orca.revoke_api_key(text),
    orca.create_webhook(text, text[], text),
    orca.rotate_webhook_secret(bigint),
    orca.set_webhook_enabled(bigint, boolean),
    orca.drop_webhook(bigint),
    orca.set_secret(text, text),
    orca.drop_secret(text),
    orca.tick(timestamptz),
    orca.create_playbook(text, text, jsonb),
    orca.drop_playbook(bigint),
    orca.resolve_incident(bigint, text),
    orca.set_incident_threshold(text, bigint, text)
    TO orca_operator;
-- What an attempt's lease allows: the functions a pipeline binary or an
-- engine calls. orca_attempt is what a runner's children log in with
-- (orca-runner --attempt-database-url); runners have it too.
GRANT EXECUTE ON FUNCTION
    orca.report_step(uuid, text, text, text, text, jsonb, text, text),
    orca.attempt_context(uuid, jsonb),
    orca.pin_read(uuid, text, text, text, bigint),
    orca.sense_context(uuid),
    orca.report_snapshots(uuid, jsonb),
    orca.keys_context(uuid),
    orca.report_keys(uuid, bigint, bigint, text[]),
    orca.claim_sync(text, uuid),
    orca.advance_head(text, integer, bigint, text, uuid),
    orca.rewind_head(text, integer, bigint, text, uuid),
    orca.record_epoch(text, integer, bigint, jsonb, uuid),
    orca.record_commit(uuid, text, text, text, bigint, integer, text),
    orca.attempt_secret(uuid, text),
    orca.discovery(uuid),
    orca.store_catalog(uuid, jsonb),
    orca.report_drift(text, integer, jsonb, uuid),
    orca.sync_lanes(text, integer, uuid),
    orca.maintenance_task(uuid),
    orca.report_maintenance(uuid, jsonb),
    orca.add_tasks(uuid, text, text, text, integer, jsonb),
    orca.task_results(uuid, text, text, bigint),
    orca.attempt_state(uuid),
    orca.resume_point(uuid, text, text),
    orca.record_resume_point(uuid, text, text, text)
    TO orca_attempt;
GRANT EXECUTE ON FUNCTION
    orca.claim(text, text, integer, text[]),
    orca.heartbeat(uuid),
    orca.finish(uuid, boolean, text, text),
    orca.finish_many(uuid[], boolean, text),
    orca.release(uuid, text),
    orca.register_runner(text, text, integer, text),
    orca.append_log(uuid, integer, text[]),
    orca.report_slot(uuid, jsonb),
    orca.claim_tasks(text, text, integer),
    orca.heartbeat_tasks(uuid[]),
    orca.finish_tasks(uuid, jsonb, text[], integer[]),
    orca.tick(timestamptz)
    TO orca_runner;
-- Relays deliver webhooks for every org, and do nothing else.
GRANT EXECUTE ON FUNCTION
    orca.relay_take(integer),
    orca.relay_done(bigint, bigint, boolean, integer, integer, text, text)
    TO orca_relay;
GRANT EXECUTE ON FUNCTION
    orca.create_org(text),
    orca.add_member(text, text),
    orca.remove_member(text, text),
    orca.rewrap_data_keys(),
    orca.allow(text, text, text),
    orca.disallow(text, text)
    TO orca_admin;

COMMENT ON FUNCTION orca.current_org_id() IS
'The id of the session''s org (SET orca.org; default ''default''). Errors: OR001 unknown org, '
'OR002 the session''s role is not a member.';

-- The Iceberg catalog (catalog.sql): read under row-level security by its
-- org's members (orca_viewer: PyIceberg, DuckDB, BI tools) and attempts;
-- written by nobody directly: pipeline binaries and engines commit through
-- the orca.catalog_* functions (iceberg.sql) with their lease, operators
-- with their session.
REVOKE ALL ON public.iceberg_tables, public.iceberg_namespace_properties FROM PUBLIC;
GRANT SELECT ON public.iceberg_tables, public.iceberg_namespace_properties TO orca_viewer, orca_attempt;
GRANT EXECUTE ON FUNCTION
    orca.catalog_create_namespace(text, text, jsonb, uuid),
    orca.catalog_create_table(text, text, text, text, uuid),
    orca.catalog_commit(text, text, text, text, text, uuid),
    orca.catalog_drop_table(text, text, text, uuid)
    TO orca_attempt, orca_operator;
