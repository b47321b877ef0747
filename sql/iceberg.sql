-- Writes to the Iceberg catalog (catalog.sql). Its tables are read through
-- row-level security (orca._catalog_visible: an org's members and its
-- attempts see its catalog, catalog_name = the org's name), but nobody
-- writes them directly: every change goes through these functions, which
-- take the org from the caller's lease (a pipeline binary or an engine)
-- or, without one, from the session (an operator of the org, or the
-- installation's admin). orca_lake's catalog calls them; so may any client.

-- The org whose catalog the caller writes: the lease's, or the session's
-- for an operator (or an API key of the operator or admin role) and the
-- installation's admin. p_catalog must be that org's name: a caller never
-- names another org's catalog.
CREATE FUNCTION orca._catalog_writer(p_catalog text, p_lease uuid) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_org  bigint;
    v_name text;
BEGIN
    IF p_lease IS NOT NULL THEN
        v_org := orca._lease_usable_org(p_lease);
        IF v_org IS NULL OR v_org IS DISTINCT FROM orca._lease_org(p_lease) THEN
            PERFORM orca._lease_refused(orca._lease_org(p_lease), p_lease);
        END IF;
    ELSE
        v_org := orca.current_org_id();
        IF NOT (orca._is_org_admin()
                OR CASE WHEN nullif(current_setting('orca.api_key', true), '') IS NOT NULL
                        THEN (orca._api_key()).role = 'operator'
                        ELSE pg_catalog.pg_has_role(session_user, 'orca_operator', 'MEMBER') END) THEN
            RAISE EXCEPTION 'writing the Iceberg catalog takes an attempt''s lease or an operator of the org'
                USING ERRCODE = '42501',
                      HINT = 'a pipeline binary or an engine passes its lease (ORCA_LEASE)';
        END IF;
    END IF;
    SELECT o.name INTO v_name FROM orca.orgs o WHERE o.id = v_org;
    IF p_catalog IS DISTINCT FROM v_name THEN
        RAISE EXCEPTION 'catalog % is not the catalog of org ''%''', quote_nullable(p_catalog), v_name
            USING ERRCODE = '42501',
                  HINT = 'each org has one catalog, named as the org; ORCA_ORG names it for a binary';
    END IF;
    RETURN v_org;
END
$$;

-- A namespace or table name, and a metadata location, as the catalog's
-- columns hold them (VARCHAR(255), VARCHAR(1000)).
CREATE FUNCTION orca._catalog_names(p_namespace text, p_table text, p_location text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_namespace IS NULL OR length(p_namespace) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION 'a namespace is 1 to 255 characters, got %',
                        CASE WHEN length(p_namespace) > 255 THEN length(p_namespace) || ' characters'
                             ELSE quote_nullable(p_namespace) END
            USING ERRCODE = 'OR044';
    END IF;
    IF p_table IS NOT NULL AND length(p_table) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION 'a table name is 1 to 255 characters, got %',
                        CASE WHEN length(p_table) > 255 THEN length(p_table) || ' characters'
                             ELSE quote_nullable(p_table) END
            USING ERRCODE = 'OR044';
    END IF;
    IF p_location IS NOT NULL AND length(p_location) NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'a metadata location is 1 to 1000 characters, got %', length(p_location)
            USING ERRCODE = 'OR044';
    END IF;
END
$$;

CREATE FUNCTION orca.catalog_create_namespace(catalog text, namespace text,
                                              properties jsonb DEFAULT '{}', lease uuid DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('catalog_create_namespace', 'catalog', octet_length(catalog_create_namespace.catalog), 1024)
                         AND orca._bound('catalog_create_namespace', 'namespace', octet_length(catalog_create_namespace.namespace), 1024)
                         AND orca._bound('catalog_create_namespace', 'properties', octet_length(catalog_create_namespace.properties::text), 65536);
    v_org bigint;
    p     record;
    v_n   integer;
BEGIN
    PERFORM orca._catalog_names(catalog_create_namespace.namespace, NULL, NULL);
    v_org := orca._catalog_writer(catalog_create_namespace.catalog, catalog_create_namespace.lease);
    IF jsonb_typeof(coalesce(catalog_create_namespace.properties, '{}')) <> 'object' THEN
        RAISE EXCEPTION 'a namespace''s properties are an object of strings, got a JSON %',
                        jsonb_typeof(catalog_create_namespace.properties)
            USING ERRCODE = 'OR044';
    END IF;
    IF EXISTS (SELECT 1 FROM jsonb_each(catalog_create_namespace.properties) p
               WHERE jsonb_typeof(p.value) <> 'string') THEN
        RAISE EXCEPTION 'a namespace''s properties are an object of strings'
            USING ERRCODE = 'OR044';
    END IF;
    INSERT INTO public.iceberg_namespace_properties AS n
        (catalog_name, namespace, property_key, property_value)
    VALUES (catalog_create_namespace.catalog, catalog_create_namespace.namespace, 'exists', 'true')
    ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    IF v_n = 0 THEN
        RETURN false;
    END IF;
    FOR p IN SELECT * FROM jsonb_each_text(coalesce(catalog_create_namespace.properties, '{}'))
             WHERE key <> 'exists' LOOP
        IF length(p.key) > 255 OR length(p.value) > 1000 THEN
            RAISE EXCEPTION 'namespace property % is longer than the catalog holds (255, 1000)',
                            left(p.key, 64)
                USING ERRCODE = 'OR044';
        END IF;
        INSERT INTO public.iceberg_namespace_properties VALUES
            (catalog_create_namespace.catalog, catalog_create_namespace.namespace, p.key, p.value);
    END LOOP;
    RETURN true;
END
$$;
COMMENT ON FUNCTION orca.catalog_create_namespace(text, text, jsonb, uuid) IS
'Creates a namespace in the caller''s org''s Iceberg catalog (catalog = the org''s name), '
'with string properties; false when it exists already. Takes the org from the attempt''s lease '
'(pipeline binaries, engines) or, without one, from the session: operators and admins of the '
'org. Errors: OR044 bad name or property, OR012/OR014/OR015 the lease, 42501 another org''s '
'catalog.';

CREATE FUNCTION orca.catalog_create_table(catalog text, namespace text, name text,
                                          metadata_location text, lease uuid DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('catalog_create_table', 'catalog', octet_length(catalog_create_table.catalog), 1024)
                         AND orca._bound('catalog_create_table', 'namespace', octet_length(catalog_create_table.namespace), 1024)
                         AND orca._bound('catalog_create_table', 'name', octet_length(catalog_create_table.name), 1024)
                         AND orca._bound('catalog_create_table', 'metadata_location', octet_length(catalog_create_table.metadata_location), 4096);
    v_org bigint;
BEGIN
    PERFORM orca._catalog_names(catalog_create_table.namespace, catalog_create_table.name,
                                catalog_create_table.metadata_location);
    IF catalog_create_table.metadata_location IS NULL THEN
        RAISE EXCEPTION 'a table needs its metadata location' USING ERRCODE = 'OR044';
    END IF;
    v_org := orca._catalog_writer(catalog_create_table.catalog, catalog_create_table.lease);
    IF NOT EXISTS (SELECT 1 FROM public.iceberg_namespace_properties n
                   WHERE n.catalog_name = catalog_create_table.catalog
                     AND n.namespace = catalog_create_table.namespace)
       AND NOT EXISTS (SELECT 1 FROM public.iceberg_tables t
                       WHERE t.catalog_name = catalog_create_table.catalog
                         AND t.table_namespace = catalog_create_table.namespace) THEN
        RAISE EXCEPTION 'no namespace % in the catalog of org ''%''',
                        quote_literal(catalog_create_table.namespace), catalog_create_table.catalog
            USING ERRCODE = 'OR045',
                  HINT = 'create it first (orca.catalog_create_namespace)';
    END IF;
    INSERT INTO public.iceberg_tables
        (catalog_name, table_namespace, table_name, metadata_location, iceberg_type)
    VALUES (catalog_create_table.catalog, catalog_create_table.namespace, catalog_create_table.name,
            catalog_create_table.metadata_location, 'TABLE')
    ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'table %.% exists already in the catalog of org ''%''',
                        catalog_create_table.namespace, catalog_create_table.name,
                        catalog_create_table.catalog
            USING ERRCODE = 'OR045';
    END IF;
END
$$;
COMMENT ON FUNCTION orca.catalog_create_table(text, text, text, text, uuid) IS
'Adds a table to a namespace of the caller''s org''s Iceberg catalog, pointing at its first '
'metadata file (written by the caller). Who may: as orca.catalog_create_namespace. Errors: '
'OR044 bad name or location, OR045 no such namespace or the table exists.';

CREATE FUNCTION orca.catalog_commit(catalog text, namespace text, name text, expected text,
                                    metadata_location text, lease uuid DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('catalog_commit', 'catalog', octet_length(catalog_commit.catalog), 1024)
                         AND orca._bound('catalog_commit', 'namespace', octet_length(catalog_commit.namespace), 1024)
                         AND orca._bound('catalog_commit', 'name', octet_length(catalog_commit.name), 1024)
                         AND orca._bound('catalog_commit', 'expected', octet_length(catalog_commit.expected), 4096)
                         AND orca._bound('catalog_commit', 'metadata_location', octet_length(catalog_commit.metadata_location), 4096);
    v_org bigint;
BEGIN
    PERFORM orca._catalog_names(catalog_commit.namespace, catalog_commit.name,
                                catalog_commit.metadata_location);
    PERFORM orca._catalog_names(catalog_commit.namespace, catalog_commit.name, catalog_commit.expected);
    IF catalog_commit.metadata_location IS NULL OR catalog_commit.expected IS NULL THEN
        RAISE EXCEPTION 'a commit names the metadata it expects and the one it installs'
            USING ERRCODE = 'OR044';
    END IF;
    v_org := orca._catalog_writer(catalog_commit.catalog, catalog_commit.lease);
    UPDATE public.iceberg_tables t
    SET metadata_location = catalog_commit.metadata_location,
        previous_metadata_location = catalog_commit.expected
    WHERE t.catalog_name = catalog_commit.catalog AND t.table_namespace = catalog_commit.namespace
      AND t.table_name = catalog_commit.name AND t.metadata_location = catalog_commit.expected
      AND (t.iceberg_type = 'TABLE' OR t.iceberg_type IS NULL);
    IF FOUND THEN
        RETURN true;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM public.iceberg_tables t
                   WHERE t.catalog_name = catalog_commit.catalog
                     AND t.table_namespace = catalog_commit.namespace
                     AND t.table_name = catalog_commit.name) THEN
        RAISE EXCEPTION 'no table %.% in the catalog of org ''%''', catalog_commit.namespace,
                        catalog_commit.name, catalog_commit.catalog
            USING ERRCODE = 'OR045';
    END IF;
    RETURN false;
END
$$;
COMMENT ON FUNCTION orca.catalog_commit(text, text, text, text, text, uuid) IS
'Commits a table of the caller''s org''s Iceberg catalog: points it at metadata_location if it '
'still points at expected (a compare-and-swap) and returns whether it did; false means another '
'commit came first (reload and retry). Who may: as orca.catalog_create_namespace. Errors: '
'OR044 bad name or location, OR045 no such table.';

CREATE FUNCTION orca.catalog_drop_table(catalog text, namespace text, name text,
                                        lease uuid DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('catalog_drop_table', 'catalog', octet_length(catalog_drop_table.catalog), 1024)
                         AND orca._bound('catalog_drop_table', 'namespace', octet_length(catalog_drop_table.namespace), 1024)
                         AND orca._bound('catalog_drop_table', 'name', octet_length(catalog_drop_table.name), 1024);
    v_org bigint;
BEGIN
    PERFORM orca._catalog_names(catalog_drop_table.namespace, catalog_drop_table.name, NULL);
    v_org := orca._catalog_writer(catalog_drop_table.catalog, catalog_drop_table.lease);
    DELETE FROM public.iceberg_tables t
    WHERE t.catalog_name = catalog_drop_table.catalog
      AND t.table_namespace = catalog_drop_table.namespace
      AND t.table_name = catalog_drop_table.name
      AND (t.iceberg_type = 'TABLE' OR t.iceberg_type IS NULL);
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION orca.catalog_drop_table(text, text, text, uuid) IS
'Removes a table from the caller''s org''s Iceberg catalog (its files stay: table maintenance '
'or the org removes them); false when there was none. Who may: as '
'orca.catalog_create_namespace.';
