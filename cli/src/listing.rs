//! What every listing command prints: a table for people (comfy-table), or
//! with `--json` an array of objects, one per row, for scripts. One place,
//! so that every listing offers both and they agree.

use chrono::{DateTime, Utc};
use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::{CellAlignment, ContentArrangement, Table};
use serde_json::{Map, Value};

/// One value of a row, shown one way in a table and exactly in JSON.
#[derive(Debug, Clone)]
pub enum Cell {
    Text(String),
    Int(i64),
    Bool(bool),
    /// RFC 3339 in JSON; to the second in a table.
    Time(DateTime<Utc>),
    /// Seconds, shown with one decimal.
    Secs(f64),
    List(Vec<String>),
    /// A JSON value: nested in JSON, compact in a table.
    Json(Value),
    None,
}

impl Cell {
    fn json(&self) -> Value {
        match self {
            Cell::Text(s) => Value::String(s.clone()),
            Cell::Int(n) => Value::from(*n),
            Cell::Bool(b) => Value::Bool(*b),
            Cell::Time(t) => Value::String(t.to_rfc3339()),
            Cell::Secs(s) => Value::from(*s),
            Cell::List(l) => Value::from(l.clone()),
            Cell::Json(v) => v.clone(),
            Cell::None => Value::Null,
        }
    }

    fn text(&self) -> String {
        match self {
            Cell::Text(s) => s.clone(),
            Cell::Int(n) => n.to_string(),
            Cell::Bool(b) => if *b { "yes" } else { "no" }.to_string(),
            Cell::Time(t) => t.format("%Y-%m-%d %H:%M:%S").to_string(),
            Cell::Secs(s) => format!("{s:.1}s"),
            Cell::List(l) => l.join(","),
            Cell::Json(v) => v.to_string(),
            Cell::None => "-".into(),
        }
    }
}

impl From<String> for Cell {
    fn from(s: String) -> Cell {
        Cell::Text(s)
    }
}

impl From<&str> for Cell {
    fn from(s: &str) -> Cell {
        Cell::Text(s.to_string())
    }
}

impl From<i64> for Cell {
    fn from(n: i64) -> Cell {
        Cell::Int(n)
    }
}

impl From<i32> for Cell {
    fn from(n: i32) -> Cell {
        Cell::Int(n.into())
    }
}

impl From<bool> for Cell {
    fn from(b: bool) -> Cell {
        Cell::Bool(b)
    }
}

impl From<DateTime<Utc>> for Cell {
    fn from(t: DateTime<Utc>) -> Cell {
        Cell::Time(t)
    }
}

impl From<Vec<String>> for Cell {
    fn from(l: Vec<String>) -> Cell {
        Cell::List(l)
    }
}

impl<T: Into<Cell>> From<Option<T>> for Cell {
    fn from(v: Option<T>) -> Cell {
        v.map_or(Cell::None, Into::into)
    }
}

/// Rows under named columns; `numeric` columns are right-aligned.
pub struct Listing {
    columns: Vec<&'static str>,
    numeric: Vec<bool>,
    rows: Vec<Vec<Cell>>,
}

impl Listing {
    /// Columns named as they are in JSON; a leading `#` marks a numeric one
    /// (right-aligned, and the `#` is not part of the name).
    pub fn new(columns: &[&'static str]) -> Listing {
        Listing {
            columns: columns.iter().map(|c| c.trim_start_matches('#')).collect(),
            numeric: columns.iter().map(|c| c.starts_with('#')).collect(),
            rows: Vec::new(),
        }
    }

    pub fn push(&mut self, row: Vec<Cell>) {
        debug_assert_eq!(row.len(), self.columns.len());
        self.rows.push(row);
    }

    /// Prints the listing; `empty` is what a table says when there are no
    /// rows (JSON says `[]`).
    pub fn print(&self, json: bool, empty: &str) {
        if json {
            println!("{}", self.to_json());
        } else if self.rows.is_empty() {
            println!("{empty}");
        } else {
            println!("{}", self.to_table());
        }
    }

    pub fn to_json(&self) -> Value {
        Value::Array(
            self.rows
                .iter()
                .map(|r| {
                    let mut m = Map::new();
                    for (c, v) in self.columns.iter().zip(r) {
                        m.insert((*c).to_string(), v.json());
                    }
                    Value::Object(m)
                })
                .collect(),
        )
    }

    pub fn to_table(&self) -> Table {
        let mut t = Table::new();
        t.load_preset(UTF8_FULL_CONDENSED)
            .set_content_arrangement(ContentArrangement::Dynamic)
            .set_header(self.columns.iter().map(|c| c.replace('_', " ")));
        for r in &self.rows {
            t.add_row(r.iter().map(Cell::text));
        }
        for (i, numeric) in self.numeric.iter().enumerate() {
            if *numeric {
                if let Some(col) = t.column_mut(i) {
                    col.set_cell_alignment(CellAlignment::Right);
                }
            }
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_exact_and_the_table_readable() {
        let at = DateTime::parse_from_rfc3339("2024-03-01T07:00:00Z")
            .map(|t| t.with_timezone(&Utc))
            .expect("time");
        let mut l = Listing::new(&["#run", "pipeline", "partitions", "finished_at", "error"]);
        l.push(vec![
            7i64.into(),
            "lake".into(),
            vec!["2024-01".to_string(), "2024-02".to_string()].into(),
            Some(at).into(),
            Option::<String>::None.into(),
        ]);
        assert_eq!(
            l.to_json(),
            serde_json::json!([{"run": 7, "pipeline": "lake", "partitions": ["2024-01", "2024-02"],
                                "finished_at": "2024-03-01T07:00:00+00:00", "error": null}])
        );
        let table = l.to_table().to_string();
        assert!(table.contains("2024-01,2024-02"), "{table}");
        assert!(table.contains("2024-03-01 07:00:00"), "{table}");
        assert!(table.contains("finished at"), "{table}");
    }
}
