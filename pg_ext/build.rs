//! Rebuilds the extension when a file of `sql/` changes: pgrx embeds them
//! with `extension_sql_file!`, which cargo does not otherwise track, so an
//! SQL-only change would install the previous SQL.

fn main() {
    println!("cargo:rerun-if-changed=../sql");
    if let Ok(dir) = std::fs::read_dir("../sql") {
        for entry in dir.flatten() {
            println!("cargo:rerun-if-changed={}", entry.path().display());
        }
    }
}
