//! mqperf's report files: `--csv` and `--plot` from a small embedded run, and `mqperf compare`
//! on synthetic reports.
//!
//! Index:
//! - `csv_rows_equal_json_rows_and_svg_has_one_bar_per_cell`: one run with `--json`, `--csv`
//!   and `--plot x.svg`; the CSV records deserialize to exactly the JSON lines' rows; the SVG
//!   parses (roxmltree) and holds one bar (a `<rect>` in mq's colour) per measured cell, plus
//!   the legend's swatch; `--plot x.png` writes a PNG (text drawn with the vendored font).
//! - `compare_gives_ratios_and_flags`: the library on synthetic reports (ratio, slower /
//!   faster / within the min-max spread, cells in one report only).
//! - `compare_exit_codes`: the binary: 3 when a cell is slower, 0 when none is, 1 for an
//!   unreadable report, 2 for a usage error.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use mq_perf::compare::{compare, Flag};
use mq_perf::payload::{FormatterKind, PayloadKind};
use mq_perf::{Config, Mode, Row, Scenario};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csv_rows_equal_json_rows_and_svg_has_one_bar_per_cell() {
    let dir = tempfile::tempdir().unwrap();
    let (csv_path, svg_path) = (dir.path().join("r.csv"), dir.path().join("r.svg"));
    let mut c = Config::new(Mode::Notx, Scenario::SendAndReceive, r".\private$\files");
    c.payloads = PayloadKind::parse_list("string:100,int,order").unwrap();
    c.formatters = FormatterKind::parse_list("raw,binary").unwrap();
    c.count = 40;
    c.runs = 2;
    c.timeout = Duration::from_secs(20);
    c.json = true;
    c.csv = Some(csv_path.clone());
    c.plot = Some(svg_path.clone());
    c.command = "mqperf NOTX SENDANDRECEIVE test".to_string();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let rows = mq_perf::run_all(&c, &mut out, &mut err)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));

    // The JSON lines are the rows run_all returned.
    let json: Vec<Row> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(json, rows);
    // order/raw is skipped (raw cannot carry an order): 6 combinations x 3 ops.
    assert_eq!(json.len(), 18);
    let measured = json.iter().filter(|r| !r.skipped).count();
    assert_eq!(measured, 15);

    // CSV: a header, then one record per JSON row, equal field by field.
    let mut reader = csv::Reader::from_path(&csv_path).unwrap();
    let header: Vec<String> = reader.headers().unwrap().iter().map(String::from).collect();
    // The same fields in the same order as a JSON line.
    let line = serde_json::to_string(&json[0]).unwrap();
    let positions: Vec<usize> = header
        .iter()
        .map(|h| {
            line.find(&format!("\"{h}\":"))
                .unwrap_or_else(|| panic!("{h} not in {line}"))
        })
        .collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{header:?}");
    let keys = serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(&line).unwrap();
    assert_eq!(header.len(), keys.len());
    let from_csv: Vec<Row> = reader.deserialize().map(|r| r.unwrap()).collect();
    assert_eq!(from_csv, json);

    // SVG: parses; one bar per measured cell in mq's colour, plus the legend swatch.
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    let doc = roxmltree::Document::parse(&svg).unwrap_or_else(|e| panic!("{e}: {svg}"));
    let mq = mq_perf::plot::colour_hex("mq");
    let bars = doc
        .descendants()
        .filter(|n| n.has_tag_name("rect"))
        .filter(|n| {
            n.attribute("fill")
                .is_some_and(|f| f.eq_ignore_ascii_case(&mq))
        })
        .count();
    assert_eq!(bars, measured + 1, "bars in mq's colour (cells + legend)");
    let text: String = doc
        .descendants()
        .filter(|n| n.is_text())
        .filter_map(|n| n.text())
        .collect::<Vec<_>>()
        .join("|");
    for needle in [
        "messages/s",
        "NOTX express: send",
        "NOTX express: e2e",
        "mqperf NOTX SENDANDRECEIVE test",
        "string:100",
    ] {
        assert!(
            text.contains(needle),
            "{needle} not in the SVG's text: {text}"
        );
    }

    // PNG from the same rows.
    let png = dir.path().join("r.png");
    mq_perf::plot::draw_file(&png, &rows, "caption").unwrap();
    let bytes = std::fs::read(&png).unwrap();
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n") && bytes.len() > 10_000);
}

/// A measured row: median and min-max msgs/s.
fn row(payload: &str, op: &str, median: f64, min: f64, max: f64) -> Row {
    serde_json::from_value(serde_json::json!({
        "target": "mq", "op": op, "mode": "NOTX", "scenario": "SENDANDRECEIVE",
        "delivery": "express", "clients": 1, "rate": null, "queues": 1, "consumers": 1,
        "backlog": null, "ack_each": false, "forwarded": false, "payload": payload,
        "formatter": "raw", "body_bytes": 100, "count": 1000, "runs": 5,
        "msgs_per_s": median, "msgs_per_s_min": min, "msgs_per_s_max": max,
        "mb_per_s": null, "mb_per_s_min": null, "mb_per_s_max": null,
        "p50_us": null, "p99_us": null, "p999_us": null, "latency": "send_to_ack",
        "rss_mib": null, "consumer_min": null, "consumer_max": null,
        "latency_samples": 0, "messages": 5000, "skipped": false, "reason": null,
        "broker": "embedded", "cores": 2, "cpu": "test", "target_version": null,
        "mapping": "express", "fsync_before_ack": false
    }))
    .unwrap()
}

fn synthetic() -> (Vec<Row>, Vec<Row>) {
    let before = vec![
        row("string:1", "send", 1000.0, 900.0, 1100.0),
        row("string:2", "send", 1000.0, 900.0, 1100.0),
        row("string:3", "send", 1000.0, 990.0, 1010.0),
        row("string:4", "send", 1000.0, 990.0, 1010.0),
        row("gone", "send", 10.0, 9.0, 11.0),
    ];
    let after = vec![
        // Slower beyond the spread: after.max 550 < before.min 900.
        row("string:1", "send", 500.0, 450.0, 550.0),
        // Within: the ranges overlap although the median moved 5 %.
        row("string:2", "send", 1050.0, 950.0, 1200.0),
        // Faster beyond the spread: after.min 1150 > before.max 1010.
        row("string:3", "send", 1200.0, 1150.0, 1300.0),
        // Touching ranges are not beyond the spread.
        row("string:4", "send", 1100.0, 1010.0, 1200.0),
        row("new", "send", 10.0, 9.0, 11.0),
    ];
    (before, after)
}

#[test]
fn compare_gives_ratios_and_flags() {
    let (before, after) = synthetic();
    let c = compare(&before, &after);
    let got: Vec<(String, f64, Flag)> = c
        .cells
        .iter()
        .map(|x| (x.key.4.clone(), (x.ratio * 1000.0).round() / 1000.0, x.flag))
        .collect();
    assert_eq!(
        got,
        vec![
            ("string:1".to_string(), 0.5, Flag::Slower),
            ("string:2".to_string(), 1.05, Flag::Same),
            ("string:3".to_string(), 1.2, Flag::Faster),
            ("string:4".to_string(), 1.1, Flag::Same),
        ]
    );
    let unmatched: Vec<(String, &str)> = c
        .unmatched
        .iter()
        .map(|(k, side)| (k.4.clone(), *side))
        .collect();
    assert_eq!(
        unmatched,
        vec![("gone".to_string(), "before"), ("new".to_string(), "after")]
    );
    assert!(c.any_slower());
    // A report against itself: every ratio 1, nothing flagged.
    let same = compare(&before, &before);
    assert!(same
        .cells
        .iter()
        .all(|x| x.ratio == 1.0 && x.flag == Flag::Same));
    assert!(!same.any_slower());
}

fn write_report(path: &Path, rows: &[Row]) {
    let mut s = String::new();
    for r in rows {
        s.push_str(&serde_json::to_string(r).unwrap());
        s.push('\n');
    }
    std::fs::write(path, s).unwrap();
}

#[test]
fn compare_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let (b, a) = (
        dir.path().join("before.json"),
        dir.path().join("after.json"),
    );
    let (before, after) = synthetic();
    write_report(&b, &before);
    write_report(&a, &after);
    let run = |args: &[&Path]| {
        Command::new(env!("CARGO_BIN_EXE_mqperf"))
            .arg("compare")
            .args(args)
            .output()
            .unwrap()
    };
    let o = run(&[&b, &a]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(3), "{stdout}");
    assert!(
        stdout.contains("SLOWER") && stdout.contains("0.500"),
        "{stdout}"
    );
    assert!(
        stdout.contains("only in before") && stdout.contains("only in after"),
        "{stdout}"
    );
    // Only faster cells: exit 0.
    let (fb, fa) = (dir.path().join("fb.json"), dir.path().join("fa.json"));
    write_report(&fb, &before[2..3]);
    write_report(&fa, &after[2..3]);
    let o = run(&[&fb, &fa]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("faster"));
    assert_eq!(o.status.code(), Some(0), "only faster");
    assert_eq!(run(&[&b, &b]).status.code(), Some(0));
    let missing = dir.path().join("missing.json");
    let o = run(&[&b, &missing]);
    assert_eq!(o.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("missing.json"), "{stderr}");
    assert_eq!(run(&[&b]).status.code(), Some(2));
}
