//! `orca maintain DATASET`: queue a dataset's table maintenance
//! (`orca.maintain`), follow the run and print what each operation did.

use postgres::Client;
use serde_json::Value;

use crate::db::explain;

pub fn run(c: &mut Client, dataset: &str, options: &str, detach: bool) -> anyhow::Result<i32> {
    let options: Value = serde_json::from_str(options)
        .map_err(|e| anyhow::anyhow!("--options is not JSON: {e}: {options}"))?;
    let id: i64 = c
        .query_one("SELECT orca.maintain($1, $2)", &[&dataset, &options])
        .map_err(explain)?
        .get(0);
    let pipeline: String = c
        .query_one(
            "SELECT p.name FROM orca.runs r JOIN orca.pipelines p ON p.id = r.pipeline_id WHERE r.id = $1",
            &[&id],
        )
        .map_err(explain)?
        .get(0);
    println!("queued maintenance run {id} of {dataset} (under pipeline {pipeline})");
    if detach {
        return Ok(0);
    }
    let code = crate::backfill::follow(c, &[id], &pipeline)?;
    for row in c
        .query(
            "SELECT kind, data FROM orca.events WHERE run_id = $1 AND kind LIKE 'dataset.%' ORDER BY id",
            &[&id],
        )
        .map_err(explain)?
    {
        let (kind, data): (String, Value) = (row.get(0), row.get(1));
        println!("{}", describe(&kind, &data));
    }
    Ok(code)
}

/// One line for what an operation did.
fn describe(kind: &str, d: &Value) -> String {
    let n = |k: &str| d[k].as_u64().unwrap_or(0);
    let len = |k: &str| d[k].as_array().map_or(0, Vec::len);
    match kind {
        "dataset.compacted" if d["snapshot"].is_null() => "compact: no partition has enough small files".into(),
        "dataset.compacted" => format!(
            "compact: {} small files of {} partitions rewritten as {} ({} rows) in snapshot {}",
            n("files_removed"),
            n("partitions"),
            n("files_added"),
            n("rows"),
            d["snapshot"]
        ),
        "dataset.expired" => format!(
            "expire: {} snapshots expired, {} kept ({} for runs or sensors), {} files ({} bytes) deleted",
            len("snapshots"),
            n("kept"),
            len("protected"),
            n("files_deleted"),
            n("bytes_deleted")
        ),
        "dataset.orphans_removed" => format!(
            "orphans: {} of {} files deleted ({} bytes), {} unreferenced but younger than the window",
            len("files"),
            n("listed"),
            n("bytes"),
            n("young")
        ),
        other => format!("{other}: {d}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reports_read_as_sentences() {
        let c = describe(
            "dataset.compacted",
            &json!({"snapshot": 7, "partitions": 2, "files_removed": 9, "files_added": 2, "rows": 100}),
        );
        assert_eq!(
            c,
            "compact: 9 small files of 2 partitions rewritten as 2 (100 rows) in snapshot 7"
        );
        assert_eq!(
            describe("dataset.compacted", &json!({"snapshot": null})),
            "compact: no partition has enough small files"
        );
        let e = describe(
            "dataset.expired",
            &json!({"snapshots": [1, 2], "kept": 3, "protected": [4], "files_deleted": 5, "bytes_deleted": 60}),
        );
        assert!(
            e.starts_with("expire: 2 snapshots expired, 3 kept (1 for runs"),
            "{e}"
        );
    }
}
