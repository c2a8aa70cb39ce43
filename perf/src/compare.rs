//! `mqperf compare BEFORE.json AFTER.json`: per cell — (target, mode, scenario, delivery,
//! payload, formatter, op) — the ratio of the median msgs/s after to before, flagged when the
//! change is beyond the run-to-run spread.
//!
//! The rule: a cell is flagged `slower` when AFTER's fastest run is slower than BEFORE's
//! slowest run (`after.max < before.min`), `faster` when AFTER's slowest run is faster than
//! BEFORE's fastest (`after.min > before.max`): the min-max ranges over the runs of the two
//! reports do not overlap. Overlapping ranges are within the noise, whatever the ratio.
//! Cells in only one report are listed as such.
//!
//! Exit codes: 0 no cell flagged slower, 1 error (a report cannot be read), 2 usage,
//! 3 at least one cell flagged slower.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Result;

use crate::report::Row;

/// The command line of `mqperf compare`.
#[derive(Debug, clap::Parser)]
#[command(
    name = "mqperf compare",
    about = "Compare two mqperf --json reports cell by cell",
    after_help = "A cell is flagged `slower` when the after report's fastest run is slower than the before report's slowest run (after.max < before.min), `faster` when after.min > before.max: the min-max ranges over runs do not overlap.\n\nExit codes: 0 no cell flagged slower, 1 error, 2 usage, 3 at least one cell flagged slower."
)]
pub struct CompareCli {
    /// The report before the change (mqperf ... --json > before.json)
    #[arg(value_name = "BEFORE.json")]
    pub before: PathBuf,
    /// The report after the change
    #[arg(value_name = "AFTER.json")]
    pub after: PathBuf,
}

/// A cell's identity.
pub type Key = (String, String, String, String, String, String, String);

fn key(r: &Row) -> Key {
    (
        r.target.clone(),
        r.mode.clone(),
        r.scenario.clone(),
        r.delivery.clone(),
        r.payload.clone(),
        r.formatter.clone(),
        r.op.clone(),
    )
}

/// Beyond the spread, or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flag {
    /// The ranges overlap.
    Same,
    /// after.max < before.min.
    Slower,
    /// after.min > before.max.
    Faster,
}

/// One compared cell.
#[derive(Debug, Clone, PartialEq)]
pub struct Cell {
    pub key: Key,
    pub before: f64,
    pub after: f64,
    /// after / before (medians).
    pub ratio: f64,
    pub flag: Flag,
}

/// The comparison of two reports.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Comparison {
    pub cells: Vec<Cell>,
    /// Cells measured in only one of the reports: (key, "before" or "after").
    pub unmatched: Vec<(Key, &'static str)>,
}

impl Comparison {
    /// Whether any cell is flagged slower (exit code 3).
    pub fn any_slower(&self) -> bool {
        self.cells.iter().any(|c| c.flag == Flag::Slower)
    }
}

/// Compares the measured rows of two reports (skipped rows are left out).
pub fn compare(before: &[Row], after: &[Row]) -> Comparison {
    let measured = |r: &&Row| !r.skipped && r.msgs_per_s.is_some();
    let mut out = Comparison::default();
    for b in before.iter().filter(measured) {
        let k = key(b);
        let Some(a) = after.iter().filter(measured).find(|a| key(a) == k) else {
            out.unmatched.push((k, "before"));
            continue;
        };
        let (bm, am) = (b.msgs_per_s.unwrap_or(0.0), a.msgs_per_s.unwrap_or(0.0));
        let (bmin, bmax) = (
            b.msgs_per_s_min.unwrap_or(bm),
            b.msgs_per_s_max.unwrap_or(bm),
        );
        let (amin, amax) = (
            a.msgs_per_s_min.unwrap_or(am),
            a.msgs_per_s_max.unwrap_or(am),
        );
        let flag = if amax < bmin {
            Flag::Slower
        } else if amin > bmax {
            Flag::Faster
        } else {
            Flag::Same
        };
        out.cells.push(Cell {
            key: k,
            before: bm,
            after: am,
            ratio: if bm > 0.0 { am / bm } else { f64::INFINITY },
            flag,
        });
    }
    for a in after.iter().filter(measured) {
        let k = key(a);
        if !before.iter().filter(measured).any(|b| key(b) == k) {
            out.unmatched.push((k, "after"));
        }
    }
    out
}

/// The comparison as a table.
pub fn write(w: &mut dyn Write, c: &Comparison) -> std::io::Result<()> {
    writeln!(
        w,
        "{:<9} {:<5} {:<15} {:<14} {:<16} {:<9} {:<7} {:>12} {:>12} {:>7}  flag",
        "target",
        "mode",
        "scenario",
        "delivery",
        "payload",
        "formatter",
        "op",
        "before/s",
        "after/s",
        "ratio"
    )?;
    for cell in &c.cells {
        let (t, m, s, d, p, f, o) = &cell.key;
        writeln!(
            w,
            "{t:<9} {m:<5} {s:<15} {d:<14} {p:<16} {f:<9} {o:<7} {:>12.1} {:>12.1} {:>7.3}  {}",
            cell.before,
            cell.after,
            cell.ratio,
            match cell.flag {
                Flag::Same => "",
                Flag::Slower => "SLOWER (beyond min-max)",
                Flag::Faster => "faster (beyond min-max)",
            }
        )?;
    }
    for ((t, m, s, d, p, f, o), side) in &c.unmatched {
        writeln!(
            w,
            "{t:<9} {m:<5} {s:<15} {d:<14} {p:<16} {f:<9} {o:<7}  only in {side}"
        )?;
    }
    let slower = c.cells.iter().filter(|x| x.flag == Flag::Slower).count();
    let faster = c.cells.iter().filter(|x| x.flag == Flag::Faster).count();
    writeln!(
        w,
        "{} cells: {slower} slower, {faster} faster beyond the run-to-run min-max, {} within it",
        c.cells.len(),
        c.cells.len() - slower - faster
    )
}

/// `mqperf compare`: reads both reports, prints the table; the exit code as documented.
pub fn main(cli: &CompareCli, out: &mut dyn Write) -> Result<u8> {
    let before = crate::spreadsheet::read_json_rows(&cli.before)?;
    let after = crate::spreadsheet::read_json_rows(&cli.after)?;
    let c = compare(&before, &after);
    write(out, &c)?;
    Ok(if c.any_slower() { 3 } else { 0 })
}
