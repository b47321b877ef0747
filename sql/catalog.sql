-- The Iceberg catalog: the SQL-catalog layout every Iceberg client reads
-- (iceberg-rust, PyIceberg, DuckDB, Spark's JDBC catalog), in schema public,
-- where those clients look for it. Each org is a catalog (catalog_name = the
-- org's name). A table's commit is a compare-and-swap of its row's
-- metadata_location.
--
-- The extension makes the two tables, so that no client creates them at run
-- time (two clients creating them at once collided, and one that came first
-- could leave columns out). A database whose clients made them before (Orca
-- 0.1.0 did, and PyIceberg may) keeps its rows: the tables are adopted into
-- the extension, and a missing iceberg_type column (NULL: a table, to every
-- client) is added.

DO $catalog$
DECLARE
    t text;
    g text;
BEGIN
    IF to_regclass('public.iceberg_tables') IS NULL THEN
        CREATE TABLE public.iceberg_tables (
            catalog_name               VARCHAR(255) NOT NULL,
            table_namespace            VARCHAR(255) NOT NULL,
            table_name                 VARCHAR(255) NOT NULL,
            metadata_location          VARCHAR(1000),
            previous_metadata_location VARCHAR(1000),
            iceberg_type               VARCHAR(5),
            PRIMARY KEY (catalog_name, table_namespace, table_name)
        );
    ELSE
        ALTER EXTENSION orca ADD TABLE public.iceberg_tables;
        ALTER TABLE public.iceberg_tables ADD COLUMN IF NOT EXISTS iceberg_type VARCHAR(5);
    END IF;
    IF to_regclass('public.iceberg_namespace_properties') IS NULL THEN
        CREATE TABLE public.iceberg_namespace_properties (
            catalog_name   VARCHAR(255) NOT NULL,
            namespace      VARCHAR(255) NOT NULL,
            property_key   VARCHAR(255),
            property_value VARCHAR(1000),
            PRIMARY KEY (catalog_name, namespace, property_key)
        );
    ELSE
        ALTER EXTENSION orca ADD TABLE public.iceberg_namespace_properties;
    END IF;
    -- An adopted table is the extension's from now on: owned by it (the
    -- client that made it would otherwise bypass row-level security and
    -- write as it likes) and granted only as grants.sql says.
    FOREACH t IN ARRAY ARRAY['public.iceberg_tables', 'public.iceberg_namespace_properties'] LOOP
        EXECUTE format('ALTER TABLE %s OWNER TO %I', t, current_user);
        FOR g IN SELECT DISTINCT pg_catalog.pg_get_userbyid(a.grantee)
                 FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
                 WHERE c.oid = t::regclass AND a.grantee <> 0 AND a.grantee <> c.relowner LOOP
            EXECUTE format('REVOKE ALL ON %s FROM %I', t, g);
        END LOOP;
    END LOOP;
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
