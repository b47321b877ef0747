#!/bin/sh
# Runs once, when the container initialises its data directory.
set -e
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" <<SQL
CREATE DATABASE orca;
\c orca
CREATE EXTENSION orca;
SQL
