-- Upgrades the orca extension from 0.2.0 to 0.3.0: ALTER EXTENSION orca UPDATE.
--
-- Every schema change of 0.3.0 goes here as well as into sql/; the release
-- test installs 0.2.0, runs this script and compares the catalog with a
-- fresh 0.3.0 install.

\echo Use "ALTER EXTENSION orca UPDATE TO '0.3.0'" to load this file. \quit
