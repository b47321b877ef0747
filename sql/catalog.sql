-- The Iceberg catalog: the SQL-catalog layout every Iceberg client reads
-- (iceberg-rust, PyIceberg, DuckDB, Spark's JDBC catalog), in schema public,
-- where those clients look for it. Each org is a catalog (catalog_name = the
-- org's name). A table's commit is a compare-and-swap of its row's
-- metadata_location.
--
-- The extension makes the two tables, so that no client creates them at run
-- time (two clients creating them at once collided, and one that came first
-- could leave columns out); nobody but the extension's functions writes
-- them (iceberg.sql).

DO $catalog$
DECLARE
    t        text;
    v_tables jsonb;
    v_ns     jsonb;
BEGIN
    -- A database whose clients made the catalog's tables before (Orca 0.1.0
    -- did, and PyIceberg may) keeps their rows, copied into tables the
    -- extension makes. The client-made tables are not adopted as they are:
    -- what their maker left on them (triggers, rules, policies, defaults,
    -- grants, ownership) would run inside the catalog's functions as the
    -- extension's owner. Each must be a plain table of the layout.
    FOREACH t IN ARRAY ARRAY['iceberg_tables', 'iceberg_namespace_properties'] LOOP
        IF (SELECT c.relkind FROM pg_catalog.pg_class c
            WHERE c.oid = to_regclass('public.' || t)) <> 'r' THEN
            RAISE EXCEPTION 'public.% is not a table, so it is not an Iceberg SQL catalog''s', t
                USING HINT = 'move it out of schema public and create or update the extension again';
        END IF;
    END LOOP;
    IF to_regclass('public.iceberg_tables') IS NOT NULL THEN
        -- PyIceberg's layout has no iceberg_type (NULL: a table, to every
        -- client).
        EXECUTE 'SELECT coalesce(jsonb_agg(jsonb_build_array(catalog_name::text, '
                'table_namespace::text, table_name::text, metadata_location::text, '
                'previous_metadata_location::text, '
                || CASE WHEN EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a
                                     WHERE a.attrelid = 'public.iceberg_tables'::regclass
                                       AND a.attname = 'iceberg_type' AND NOT a.attisdropped)
                        THEN 'iceberg_type::text' ELSE 'NULL::text' END
                || ')), ''[]'') FROM public.iceberg_tables'
            INTO v_tables;
        DROP TABLE public.iceberg_tables;
    END IF;
    IF to_regclass('public.iceberg_namespace_properties') IS NOT NULL THEN
        SELECT coalesce(jsonb_agg(jsonb_build_array(catalog_name::text, namespace::text,
                                                    property_key::text, property_value::text)), '[]')
        INTO v_ns FROM public.iceberg_namespace_properties;
        DROP TABLE public.iceberg_namespace_properties;
    END IF;
    CREATE TABLE public.iceberg_tables (
        catalog_name               VARCHAR(255) NOT NULL,
        table_namespace            VARCHAR(255) NOT NULL,
        table_name                 VARCHAR(255) NOT NULL,
        metadata_location          VARCHAR(1000),
        previous_metadata_location VARCHAR(1000),
        iceberg_type               VARCHAR(5),
        PRIMARY KEY (catalog_name, table_namespace, table_name)
    );
    CREATE TABLE public.iceberg_namespace_properties (
        catalog_name   VARCHAR(255) NOT NULL,
        namespace      VARCHAR(255) NOT NULL,
        property_key   VARCHAR(255),
        property_value VARCHAR(1000),
        PRIMARY KEY (catalog_name, namespace, property_key)
    );
    INSERT INTO public.iceberg_tables
    SELECT r->>0, r->>1, r->>2, r->>3, r->>4, r->>5 FROM jsonb_array_elements(v_tables) r;
    INSERT INTO public.iceberg_namespace_properties
    SELECT r->>0, r->>1, r->>2, r->>3 FROM jsonb_array_elements(v_ns) r;
END
$catalog$;
COMMENT ON TABLE public.iceberg_tables IS
'The Iceberg SQL catalog''s tables: one row per table of each org (catalog_name = the org), '
'pointing at its current metadata file. Made by the orca extension.';
COMMENT ON TABLE public.iceberg_namespace_properties IS
'The Iceberg SQL catalog''s namespaces and their properties, per org (catalog_name). Made by '
'the orca extension.';

-- pg_dump keeps the catalog's rows: they are the tables' current versions.
SELECT pg_catalog.pg_extension_config_dump('public.iceberg_tables', '');
SELECT pg_catalog.pg_extension_config_dump('public.iceberg_namespace_properties', '');
