-- Building blocks of every domain: helper envelopes, the outbox, admins.
--
-- How the SQL API is built: every public function runs as the extension owner
-- (SECURITY DEFINER, with a fixed search_path) and scopes every statement to
-- the session's org, because the owner is not subject to row-level security.
-- Functions named orca._* are internal: granted to nobody, called by the API
-- with an org it already checked. docs/sql.md is the reference; the COMMENT ON
-- text is what \df+ shows. One file per domain; the files are included in the
-- order pg_ext/src/lib.rs gives.

-- Raises the error in a helper's envelope with its own SQLSTATE, or returns
-- the value it carries.
CREATE FUNCTION orca._unwrap(r jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF r ? 'error' THEN
        IF r->'error'->>'hint' IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = r->'error'->>'code', MESSAGE = r->'error'->>'message';
        END IF;
        RAISE EXCEPTION USING ERRCODE = r->'error'->>'code', MESSAGE = r->'error'->>'message',
                              HINT = r->'error'->>'hint';
    END IF;
    RETURN r->'ok';
END
$$;

CREATE FUNCTION orca._event(p_org bigint, p_kind text, p_pipeline bigint, p_run bigint,
                            p_attempt bigint, p_data jsonb DEFAULT '{}')
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO orca.events (org_id, kind, pipeline_id, run_id, attempt_id, data)
    VALUES (p_org, p_kind, p_pipeline, p_run, p_attempt, coalesce(p_data, '{}'));
END
$$;

-- PL/pgSQL rather than SQL for the small helpers below: it keeps their plans
-- across calls, where a non-inlined SQL function is planned on every call.
CREATE FUNCTION orca._is_admin() RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- A session that presents an API key is what the key says, whatever
    -- its login may do (orca serve's login takes the caller's key).
    IF nullif(current_setting('orca.api_key', true), '') IS NOT NULL THEN
        RETURN (orca._api_key()).role = 'admin';
    END IF;
    RETURN EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = session_user AND r.rolsuper)
        OR pg_catalog.pg_has_role(session_user, 'orca_admin', 'MEMBER');
END
$$;

-- Refuses an API key session: the installation's administration (orgs,
-- members, netguard, the installation key) is done by orca_admin logins,
-- not by an org's API key, whatever its role.
CREATE FUNCTION orca._installation_admin() RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF nullif(current_setting('orca.api_key', true), '') IS NOT NULL THEN
        RAISE EXCEPTION 'installation administration takes an orca_admin login, not an API key'
            USING ERRCODE = '42501',
                  HINT = 'an API key acts in its own org only, even with the admin role';
    END IF;
END
$$;
