//! Reading a Postgres source's catalog (the rules are
//! `orca_core::catalog`'s): the `orca discover` command and the engine's
//! discovery task both connect to the source and call [`postgres_catalog`].

use orca_core::catalog::{self, Column, ServerFacts, TableFacts};
use serde_json::Value;

/// The catalog of the database `client` is connected to, read as a source
/// of `kind` (`postgres` or `postgres_cdc`).
pub fn postgres_catalog(
    client: &mut postgres::Client,
    kind: &str,
) -> Result<Value, postgres::Error> {
    let s = client.query_one(catalog::SERVER_SQL, &[])?;
    let server = ServerFacts {
        wal_level: s.try_get(0)?,
        replication_role: s.try_get(1)?,
        version: s.try_get(2)?,
    };
    let mut tables = Vec::new();
    for r in client.query(catalog::TABLES_SQL, &[])? {
        let columns: Value = r.try_get(3)?;
        tables.push(TableFacts {
            table: r.try_get(0)?,
            identity: r.try_get(1)?,
            primary_key: r.try_get(2)?,
            columns: serde_json::from_value::<Vec<Column>>(columns).unwrap_or_default(),
            rows_estimate: r.try_get(4)?,
        });
    }
    Ok(catalog::postgres(kind, &server, &tables))
}
