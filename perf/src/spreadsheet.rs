//! `--csv FILE`: the report's rows as CSV, one record per JSON line with the same fields in
//! the same order (header first; an absent value is an empty field), and reading JSON-lines
//! reports back ([`read_json_rows`]) for `compare` and `plot`.

use std::io::BufRead;
use std::path::Path;

use anyhow::{Context, Result};

use crate::report::Row;

/// Writes `rows` as CSV to `w`.
pub fn write_csv<W: std::io::Write>(w: W, rows: &[Row]) -> Result<()> {
    let mut csv = csv::Writer::from_writer(w);
    for r in rows {
        csv.serialize(r)?;
    }
    csv.flush()?;
    Ok(())
}

/// Writes `rows` as CSV to the file `path` (replacing it).
pub fn write_csv_file(path: &Path, rows: &[Row]) -> Result<()> {
    let f = std::fs::File::create(path)?;
    write_csv(std::io::BufWriter::new(f), rows)
}

/// Reads a report written by `--json`: one [`Row`] per line; blank lines are skipped. An
/// unreadable line is an error naming its number.
pub fn read_json_rows(path: &Path) -> Result<Vec<Row>> {
    let f = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut rows = Vec::new();
    for (i, line) in std::io::BufReader::new(f).lines().enumerate() {
        let line = line.with_context(|| format!("cannot read {}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let row: Row = serde_json::from_str(&line).with_context(|| {
            format!(
                "{} line {}: not an mqperf --json row",
                path.display(),
                i + 1
            )
        })?;
        rows.push(row);
    }
    Ok(rows)
}
