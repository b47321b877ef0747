//! `orca-bench-sync shapes`: the table sync on tables of one kind of column
//! each (wide text, jsonb, numeric, arrays), orca-engine against DuckDB's
//! Postgres scanner and the raw binary COPY, in the same run. The mixed
//! table of the default run hides a shape that is slow on its own.

use anyhow::Result;

use crate::{copy_ceiling, ensure_table, env_or, orca, peer, result};

/// A shape: its table's columns (after `id bigint PRIMARY KEY`) and the
/// values of row `g`.
struct Shape {
    name: &'static str,
    columns: &'static str,
    values: &'static str,
}

const SHAPES: &[Shape] = &[
    Shape {
        name: "wide_text",
        columns: "a text, b text, c text, d text, e varchar(200), f text, g2 text, h text",
        values: "md5(g::text), 'customer-' || (g % 50000), repeat(md5((g + 1)::text), 3),
                 CASE WHEN g % 4 = 0 THEN NULL ELSE 'note ' || g || ' ' || md5((g * 7)::text) END,
                 substr(md5((g * 3)::text), 1, 12), (ARRAY['open','closed','pending'])[g % 3 + 1],
                 'https://example.com/items/' || g || '?ref=' || (g % 97),
                 repeat('x', (g % 64)::int)",
    },
    Shape {
        name: "jsonb",
        columns: "doc jsonb",
        values: "jsonb_build_object(
                    'id', g, 'name', 'customer-' || (g % 50000), 'active', g % 3 = 0,
                    'score', g / 7.0, 'tags', jsonb_build_array('t' || (g % 7), 'u' || (g % 11)),
                    'address', jsonb_build_object('city', 'city-' || (g % 300),
                                                  'zip', lpad((g % 99999)::text, 5, '0')),
                    'created', '2024-01-01'::timestamptz + g * interval '1 second')",
    },
    Shape {
        name: "numeric",
        columns: "a numeric(18,4), b numeric(18,4), c numeric(12,2), d numeric(38,10),
                  e numeric(18,4), f numeric",
        values: "(g % 1000000) / 7.0, -(g % 123457) / 3.0, (g % 100000) / 100.0,
                 g * 1234.5678901234, (g % 999) * 1.5, g / 13.0",
    },
    Shape {
        name: "arrays",
        columns: "ints int4[], names text[], scores float8[]",
        values: "ARRAY[g % 10, g % 100, g % 1000, g % 7, g % 11, g % 13, g % 17, g % 19]::int4[],
                 ARRAY['a' || (g % 5), 'b' || (g % 50), 'c' || (g % 500), 'd' || g],
                 ARRAY[g / 3.0, g / 7.0, g / 11.0, g / 13.0]::float8[]",
    },
];

pub fn run(url: &str, work: &std::path::Path) -> Result<()> {
    let rows: i64 = env_or("SHAPE_ROWS", 500_000);
    let only = std::env::var("SHAPES").ok();
    let mut c = postgres::Client::connect(url, postgres::NoTls)?;
    for shape in SHAPES {
        if only
            .as_deref()
            .is_some_and(|o| !o.split(',').any(|n| n == shape.name))
        {
            continue;
        }
        let table = format!("bench_shape_{}", shape.name);
        ensure_table(
            &mut c,
            &table,
            rows,
            &format!("id bigint PRIMARY KEY, {}", shape.columns),
            &format!("g, {}", shape.values),
        )?;
        let (copy_rows, copy_secs, copy_bytes, copy_busy) = copy_ceiling(url, &table)?;
        let dir = work.join(&table);
        std::fs::create_dir_all(dir.join("orca"))?;
        std::fs::create_dir_all(dir.join("split1"))?;
        let (orca_rows, orca_secs, orca_busy) =
            orca(url, &table, "id", &dir.join("orca"), false, None)?;
        let (split_rows, split_secs, split_busy) =
            orca(url, &table, "id", &dir.join("split1"), false, Some(1))?;
        let duck = peer(
            "DLT_PYTHON",
            "DUCKDB_SCRIPT",
            url,
            &table,
            &dir.join("duckdb"),
        )?;
        let mb = copy_bytes as f64 / 1e6;
        println!(
            "# shape {}: {copy_rows} rows, {mb:.1} MB as binary COPY",
            shape.name
        );
        let mut figures = vec![
            ("copy-binary", copy_rows, copy_secs, copy_busy),
            ("orca-engine", orca_rows, orca_secs, orca_busy),
            ("orca-split1", split_rows, split_secs, split_busy),
        ];
        if let Some((rows, secs, busy, _)) = &duck {
            figures.push(("duckdb", *rows, *secs, *busy));
        }
        for (name, rows, secs, busy) in figures {
            let label = format!("{}/{name}", shape.name);
            result(&label, rows, copy_rows, secs, mb, busy)?;
        }
        match duck {
            Some((_, secs, _, _)) => println!(
                "RATIO {} orca-engine / duckdb = {:.2} (target >= 1.0); orca-split1 / duckdb = {:.2}",
                shape.name,
                secs / orca_secs,
                secs / split_secs
            ),
            None => println!("# DuckDB not run (set DLT_PYTHON and DUCKDB_SCRIPT)"),
        }
        println!(
            "RATIO {} orca-engine / copy-binary = {:.2}",
            shape.name,
            copy_secs / orca_secs
        );
    }
    Ok(())
}
