//! The files source's workload: JSON-lines files dropped one by one where a
//! batch sync reads them, in the bucket (odd seeds: the engine reads them
//! through the fault proxy) or in a directory (even seeds), and loaded into
//! Postgres exactly once (files are immutable: a record's file and offset
//! is its identity). The sync is run again after every fault, as the
//! connector's is.

use std::path::PathBuf;

use orca_tests::s3::S3Server;
use orca_tests::*;
use serde_json::json;

use crate::world::BUCKET;

/// Records in each file dropped.
const RECORDS: i64 = 50;

pub struct Drops {
    /// The source's `url`: `s3://chaos/in` or a directory.
    pub url: String,
    /// The directory, when the files are local.
    local: Option<PathBuf>,
    /// The last record id written (ids run from 1).
    written: i64,
    /// Every run of the sync started so far.
    pub runs: Vec<i64>,
}

impl Drops {
    pub fn new(local: Option<PathBuf>) -> Drops {
        let url = match &local {
            Some(dir) => {
                std::fs::create_dir_all(dir.join("drops")).expect("drops dir");
                dir.to_string_lossy().into_owned()
            }
            None => format!("s3://{BUCKET}/in"),
        };
        Drops {
            url,
            local,
            written: 0,
            runs: Vec::new(),
        }
    }

    pub async fn define(&self, db: &TestDb) {
        sqlx::query(
            "SELECT orca.create_sync('drops', $1, $2, $3, NULL, 'exactly_once', 'default', $4)",
        )
        .bind(json!({"type": "files", "url": self.url, "format": "jsonl"}))
        .bind(json!({"type": "postgres", "url": db.url(), "schema": "raw"}))
        .bind(json!([{"name": "drops", "pattern": "drops/*.jsonl"}]))
        .bind(crate::events::RUN_RETRIES)
        .execute(&db.pool)
        .await
        .expect("create_sync drops");
    }

    /// Drops the next file (whole: renamed into place, or one PUT), named
    /// to sort after every file before it.
    pub fn drop_file(&mut self, s3: &S3Server) {
        let first = self.written + 1;
        let file = self.written / RECORDS;
        let body: String = (first..first + RECORDS)
            .map(|id| {
                format!(
                    "{}\n",
                    json!({"id": id, "file": file, "note": format!("record {id}")})
                )
            })
            .collect();
        let name = format!("drops/{file:06}.jsonl");
        match &self.local {
            Some(dir) => {
                let tmp = dir.join(format!("{name}.partial"));
                std::fs::write(&tmp, &body).expect("write a drop");
                std::fs::rename(&tmp, dir.join(&name)).expect("rename a drop into place");
            }
            None => {
                s3.boto(&format!(
                    "s.put_object(Bucket='{BUCKET}', Key='in/{name}', Body={body:?}.encode())"
                ));
            }
        }
        self.written += RECORDS;
    }

    /// The last record id written.
    pub fn written(&self) -> i64 {
        self.written
    }
}
