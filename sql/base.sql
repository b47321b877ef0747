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
--
-- The installation's admin: a superuser or orca_admin login that presents
-- no API key. Only it acts across orgs (sees every org's catalog, ticks
-- every org, runs a runner without a token, drives a sync by hand). An API
-- key is its org's, whatever its role: an org's admin is not the
-- installation's (orca._is_org_admin).
CREATE FUNCTION orca._is_admin() RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF nullif(current_setting('orca.api_key', true), '') IS NOT NULL THEN
        RETURN false;
    END IF;
    RETURN EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = session_user AND r.rolsuper)
        OR pg_catalog.pg_has_role(session_user, 'orca_admin', 'MEMBER');
END
$$;

-- The installation's superuser, presenting no API key: the only one who
-- may move the clock (orca.tick(now => ...)).
CREATE FUNCTION orca._is_superuser() RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF nullif(current_setting('orca.api_key', true), '') IS NOT NULL THEN
        RETURN false;
    END IF;
    RETURN EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = session_user AND r.rolsuper);
END
$$;

-- An admin of the session's org: the installation's admin, or an API key
-- with the admin role (for its own org only: orca.current_org_id is the
-- key's).
CREATE FUNCTION orca._is_org_admin() RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- A session that presents an API key is what the key says, whatever
    -- its login may do (orca serve's login takes the caller's key).
    IF nullif(current_setting('orca.api_key', true), '') IS NOT NULL THEN
        RETURN (orca._api_key()).role = 'admin';
    END IF;
    RETURN orca._is_admin();
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

-- Every text and jsonb a function takes is held to a bound before it is
-- looked at (docs/security.md, "Limits on what comes in"): what a caller
-- sends is never stored, echoed or parsed beyond it. p_size is in bytes.
-- Each function checks its inputs in the first line of its DECLARE
-- section, before any other initializer reads them.
CREATE FUNCTION orca._bound(p_fn text, p_arg text, p_size bigint, p_max bigint) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_size > p_max THEN
        RAISE EXCEPTION 'orca.%: % is % bytes, more than its bound of % bytes', p_fn, p_arg, p_size, p_max
            USING ERRCODE = 'OR051',
                  HINT = 'docs/security.md lists the bound of every input';
    END IF;
    RETURN true;
END
$$;
