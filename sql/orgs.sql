-- Orgs and their members. Who may act in which org is membership
-- (orca.members); what a role may do comes from the orca_* group roles
-- (grants.sql). orca.current_org_id and the row-level security policies are
-- in schema.sql, beside the tables they guard.

CREATE FUNCTION orca.create_org(name text) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_bounded boolean := orca._bound('create_org', 'name', octet_length(create_org.name), 1024);
    v_id bigint;
BEGIN
    PERFORM orca._installation_admin();
    IF create_org.name IS NULL OR create_org.name !~ '^[a-z][a-z0-9_-]{0,62}$' THEN
        RAISE EXCEPTION 'invalid org name %', quote_nullable(create_org.name)
            USING ERRCODE = 'OR003',
                  HINT = 'use 1 to 63 lowercase letters, digits, ''_'' or ''-'', starting with a letter';
    END IF;
    INSERT INTO orca.orgs (name) VALUES (create_org.name)
    ON CONFLICT ON CONSTRAINT orgs_name_key DO NOTHING
    RETURNING id INTO v_id;
    IF v_id IS NULL THEN
        RAISE EXCEPTION 'org ''%'' already exists', create_org.name USING ERRCODE = 'OR003';
    END IF;
    PERFORM orca._event(v_id, 'org.created', NULL, NULL, NULL,
                        jsonb_build_object('name', create_org.name, 'by', session_user));
    RETURN v_id;
END
$$;
COMMENT ON FUNCTION orca.create_org(text) IS
'Creates an org and returns its id. Admins only. Example: SELECT orca.create_org(''acme'');';

CREATE FUNCTION orca.add_member(org text, role text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_bounded boolean := orca._bound('add_member', 'org', octet_length(add_member.org), 1024)
                         AND orca._bound('add_member', 'role', octet_length(add_member.role), 1024);
    v_org bigint;
BEGIN
    PERFORM orca._installation_admin();
    SELECT id INTO v_org FROM orca.orgs o WHERE o.name = add_member.org;
    IF v_org IS NULL THEN
        RAISE EXCEPTION 'unknown org ''%''', add_member.org USING ERRCODE = 'OR001';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = add_member.role) THEN
        RAISE EXCEPTION 'unknown role %', quote_nullable(add_member.role)
            USING ERRCODE = 'OR004', HINT = 'create the role first (CREATE ROLE ...)';
    END IF;
    INSERT INTO orca.members (org_id, role_name) VALUES (v_org, add_member.role)
    ON CONFLICT DO NOTHING;
    PERFORM orca._event(v_org, 'org.member_added', NULL, NULL, NULL,
                        jsonb_build_object('role', add_member.role, 'by', session_user));
END
$$;
COMMENT ON FUNCTION orca.add_member(text, text) IS
'Lets a role (and every role that is a member of it) act in an org. Admins only. '
'Permissions come from the orca_viewer, orca_operator, orca_runner and orca_admin roles; '
'membership decides the org. Example: SELECT orca.add_member(''acme'', ''acme_ops'');';

CREATE FUNCTION orca.remove_member(org text, role text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_bounded boolean := orca._bound('remove_member', 'org', octet_length(remove_member.org), 1024)
                         AND orca._bound('remove_member', 'role', octet_length(remove_member.role), 1024);
    v_org bigint;
BEGIN
    PERFORM orca._installation_admin();
    SELECT id INTO v_org FROM orca.orgs o WHERE o.name = remove_member.org;
    IF v_org IS NULL THEN
        RAISE EXCEPTION 'unknown org ''%''', remove_member.org USING ERRCODE = 'OR001';
    END IF;
    DELETE FROM orca.members m WHERE m.org_id = v_org AND m.role_name = remove_member.role;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'role % is not a member of org ''%''', quote_nullable(remove_member.role),
                        remove_member.org
            USING ERRCODE = 'OR004';
    END IF;
    PERFORM orca._event(v_org, 'org.member_removed', NULL, NULL, NULL,
                        jsonb_build_object('role', remove_member.role, 'by', session_user));
END
$$;
COMMENT ON FUNCTION orca.remove_member(text, text) IS
'Takes a role''s membership of an org away. Admins only.';
