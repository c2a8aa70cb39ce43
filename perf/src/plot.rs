//! `--plot FILE` and `mqperf plot`: the white paper's figures, drawn with `plotters` as SVG or
//! PNG. A grid of bar charts: one row of panels per delivery mode (NOTX express, NOTX
//! recoverable, TX transactional), one column per op (send, receive, e2e, ...); in each panel
//! one group of bars per payload/formatter, one bar per target (mq, rabbitmq, nats, side by
//! side, always in the same colours), its height the median msgs/s and its error bar the
//! min-max over runs. Above the grid: the caption (machine and command) and the legend.
//!
//! Text is laid out with a vendored subset of DejaVu Sans (`perf/fonts/`, with its license),
//! registered with plotters' `ab_glyph` backend, so PNGs render the same on a machine without
//! system fonts. Every bar is one `<rect>` filled with its target's colour; the legend adds one
//! more per target.

use std::path::Path;
use std::sync::OnceLock;

use anyhow::{anyhow, bail, Context, Result};
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::machine::Machine;
use crate::report::Row;

static FONT: &[u8] = include_bytes!("../fonts/DejaVuSans-subset.ttf");
/// The family name the figures ask for (the vendored font, registered under it).
const FAMILY: &str = "sans-serif";

/// The output format, by the file name's extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Svg,
    Png,
}

impl Format {
    /// `.svg` or `.png` (case-insensitive); anything else is `None`.
    pub fn of(path: &Path) -> Option<Format> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "svg" => Some(Format::Svg),
            "png" => Some(Format::Png),
            _ => None,
        }
    }
}

/// The colour of a target's bars: mq blue, rabbitmq orange, nats green, others grey.
pub fn colour(target: &str) -> RGBColor {
    match target {
        "mq" => RGBColor(0x1f, 0x77, 0xb4),
        "rabbitmq" => RGBColor(0xff, 0x7f, 0x0e),
        "nats" => RGBColor(0x2c, 0xa0, 0x2c),
        _ => RGBColor(0x7f, 0x7f, 0x7f),
    }
}

/// `#RRGGBB` of [`colour`], as the SVG has it.
pub fn colour_hex(target: &str) -> String {
    let RGBColor(r, g, b) = colour(target);
    format!("#{r:02X}{g:02X}{b:02X}")
}

/// The caption line: machine and command.
pub fn caption(machine: &Machine, command: &str) -> String {
    format!(
        "{} cores, {} | {}",
        machine.cores,
        machine.cpu,
        if command.is_empty() {
            "mqperf"
        } else {
            command
        }
    )
}

fn register_font() -> Result<()> {
    static DONE: OnceLock<bool> = OnceLock::new();
    let ok = *DONE.get_or_init(|| register_font_once(FAMILY));
    if ok {
        Ok(())
    } else {
        bail!("cannot load the vendored font")
    }
}

fn register_font_once(family: &str) -> bool {
    plotters::style::register_font(family, FontStyle::Normal, FONT).is_ok()
}

/// The panels of a set of rows: (mode, delivery) and ops, each in first-seen order, the
/// targets, and per panel the payload/formatter categories. Skipped rows and rows without a
/// rate are left out.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    /// `"NOTX express"`, `"TX transactional"`, ...
    pub modes: Vec<(String, String)>,
    pub ops: Vec<String>,
    pub targets: Vec<String>,
}

impl Layout {
    pub fn of(rows: &[Row]) -> Layout {
        let mut l = Layout {
            modes: Vec::new(),
            ops: Vec::new(),
            targets: Vec::new(),
        };
        for r in measured(rows) {
            let m = (r.mode.clone(), r.delivery.clone());
            if !l.modes.contains(&m) {
                l.modes.push(m);
            }
            if !l.ops.contains(&r.op) {
                l.ops.push(r.op.clone());
            }
            if !l.targets.contains(&r.target) {
                l.targets.push(r.target.clone());
            }
        }
        l
    }
}

fn measured(rows: &[Row]) -> impl Iterator<Item = &Row> {
    rows.iter().filter(|r| !r.skipped && r.msgs_per_s.is_some())
}

/// The payload/formatter categories of one panel, in first-seen order.
fn categories(rows: &[Row], mode: &(String, String), op: &str) -> Vec<String> {
    let mut c: Vec<String> = Vec::new();
    for r in measured(rows).filter(|r| r.mode == mode.0 && r.delivery == mode.1 && r.op == op) {
        let name = format!("{}/{}", r.payload, r.formatter);
        if !c.contains(&name) {
            c.push(name);
        }
    }
    c
}

/// The figure's size in pixels for a layout.
fn size(l: &Layout) -> (u32, u32) {
    let cols = l.ops.len().max(1) as u32;
    let rows = l.modes.len().max(1) as u32;
    ((380 * cols).max(760), 90 + 330 * rows)
}

/// Draws the figures as an SVG document.
pub fn draw_svg(rows: &[Row], caption: &str) -> Result<String> {
    register_font()?;
    let l = Layout::of(rows);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size(&l)).into_drawing_area();
        draw(&root, rows, &l, caption)?;
        root.present().map_err(|e| anyhow!("{e}"))?;
    }
    Ok(svg)
}

/// Draws the figures to `path`, SVG or PNG by its extension.
pub fn draw_file(path: &Path, rows: &[Row], caption: &str) -> Result<()> {
    let Some(format) = Format::of(path) else {
        bail!("the file name must end in .svg or .png");
    };
    if measured(rows).next().is_none() {
        bail!("nothing was measured, so there is nothing to draw");
    }
    register_font()?;
    let l = Layout::of(rows);
    match format {
        Format::Svg => {
            let svg = draw_svg(rows, caption)?;
            std::fs::write(path, svg)?;
        }
        Format::Png => {
            let root = BitMapBackend::new(path, size(&l)).into_drawing_area();
            draw(&root, rows, &l, caption)?;
            root.present().map_err(|e| anyhow!("{e}"))?;
        }
    }
    Ok(())
}

/// Compact numbers for the y axis: 950, 12k, 1.5M.
fn short(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if v >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    rows: &[Row],
    l: &Layout,
    caption: &str,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("{e:?}");
    root.fill(&WHITE).map_err(err)?;
    let (top, body) = root.split_vertically(90);
    top.draw(&Text::new(
        "mqperf: messages/s per payload/formatter (bar: median over runs, whisker: min-max)",
        (12, 8),
        (FAMILY, 17).into_font().color(&BLACK),
    ))
    .map_err(err)?;
    let cap: String = caption.chars().take(160).collect();
    top.draw(&Text::new(
        cap,
        (12, 32),
        (FAMILY, 12).into_font().color(&RGBColor(0x44, 0x44, 0x44)),
    ))
    .map_err(err)?;
    let mut x = 12;
    for t in &l.targets {
        let c = colour(t);
        top.draw(&Rectangle::new([(x, 58), (x + 14, 72)], c.filled()))
            .map_err(err)?;
        top.draw(&Text::new(
            t.clone(),
            (x + 20, 58),
            (FAMILY, 13).into_font().color(&BLACK),
        ))
        .map_err(err)?;
        x += 30 + 9 * t.len() as i32;
    }
    let panels = body.split_evenly((l.modes.len().max(1), l.ops.len().max(1)));
    let nt = l.targets.len().max(1);
    for (mi, mode) in l.modes.iter().enumerate() {
        for (oi, op) in l.ops.iter().enumerate() {
            let area = &panels[mi * l.ops.len() + oi];
            let cats = categories(rows, mode, op);
            let cell = |t: &str, cat: &str| {
                measured(rows).find(|r| {
                    r.target == t
                        && r.mode == mode.0
                        && r.delivery == mode.1
                        && r.op == *op
                        && format!("{}/{}", r.payload, r.formatter) == cat
                })
            };
            let ymax = measured(rows)
                .filter(|r| r.mode == mode.0 && r.delivery == mode.1 && r.op == *op)
                .map(|r| r.msgs_per_s_max.or(r.msgs_per_s).unwrap_or(0.0))
                .fold(0.0f64, f64::max)
                .max(1.0)
                * 1.12;
            let ncat = cats.len().max(1);
            let mut chart = ChartBuilder::on(area)
                .caption(
                    format!("{} {}: {op}", mode.0, mode.1),
                    (FAMILY, 15).into_font(),
                )
                .margin(10)
                .x_label_area_size(52)
                .y_label_area_size(58)
                .build_cartesian_2d(0f64..ncat as f64, 0f64..ymax)
                .map_err(err)?;
            chart
                .configure_mesh()
                .disable_x_mesh()
                .y_max_light_lines(2)
                .x_labels(0)
                .x_desc("payload / formatter")
                .y_desc("messages/s")
                .y_label_formatter(&|v| short(*v))
                .label_style((FAMILY, 11))
                .axis_desc_style((FAMILY, 12))
                .draw()
                .map_err(err)?;
            let w = 0.8 / nt as f64;
            for (ci, cat) in cats.iter().enumerate() {
                for (ti, t) in l.targets.iter().enumerate() {
                    let Some(r) = cell(t, cat) else { continue };
                    let median = r.msgs_per_s.unwrap_or(0.0);
                    let x0 = ci as f64 + 0.1 + ti as f64 * w;
                    let x1 = x0 + w * 0.92;
                    chart
                        .draw_series(std::iter::once(Rectangle::new(
                            [(x0, 0.0), (x1, median)],
                            colour(t).filled(),
                        )))
                        .map_err(err)?;
                    let (lo, hi) = (
                        r.msgs_per_s_min.unwrap_or(median),
                        r.msgs_per_s_max.unwrap_or(median),
                    );
                    // The median above the bar (and its whisker), so a bar too short to see
                    // still reads.
                    let (tx, ty) = chart.backend_coord(&((x0 + x1) / 2.0, hi.max(median)));
                    let value = (FAMILY, 9)
                        .into_font()
                        .color(&RGBColor(0x33, 0x33, 0x33))
                        .pos(plotters::style::text_anchor::Pos::new(
                            plotters::style::text_anchor::HPos::Center,
                            plotters::style::text_anchor::VPos::Bottom,
                        ));
                    root.draw(&Text::new(short(median), (tx, ty - 2), value))
                        .map_err(err)?;
                    chart
                        .draw_series(std::iter::once(ErrorBar::new_vertical(
                            (x0 + x1) / 2.0,
                            lo,
                            median,
                            hi,
                            BLACK.stroke_width(1),
                            6,
                        )))
                        .map_err(err)?;
                }
                // Payload over formatter, centred under the group.
                let (px, py) = chart.backend_coord(&(ci as f64 + 0.5, 0.0));
                let style = (FAMILY, 11).into_font().color(&BLACK).pos(
                    plotters::style::text_anchor::Pos::new(
                        plotters::style::text_anchor::HPos::Center,
                        plotters::style::text_anchor::VPos::Top,
                    ),
                );
                let (payload, formatter) = cat.split_once('/').unwrap_or((cat.as_str(), ""));
                for (k, part) in [payload, formatter].into_iter().enumerate() {
                    let text: String = part.chars().take(24).collect();
                    root.draw(&Text::new(
                        text,
                        (px, py + 5 + 13 * k as i32),
                        style.clone(),
                    ))
                    .map_err(err)?;
                }
            }
        }
    }
    Ok(())
}

/// `mqperf plot`: draws the rows of one or more `--json` reports into one figure.
#[derive(Debug, clap::Parser)]
#[command(
    name = "mqperf plot",
    about = "Draw the figures of one or more mqperf --json reports (e.g. express, recoverable and TX runs) into one SVG or PNG"
)]
pub struct PlotCli {
    /// The reports (JSON lines, as `mqperf ... --json` prints them)
    #[arg(value_name = "REPORT.json", required = true)]
    pub reports: Vec<std::path::PathBuf>,
    /// The figure: .svg or .png
    #[arg(long, short, value_name = "FILE")]
    pub out: std::path::PathBuf,
    /// The caption (default: the machine and the reports' names)
    #[arg(long, value_name = "TEXT")]
    pub caption: Option<String>,
}

/// Runs `mqperf plot`.
pub fn main(cli: &PlotCli) -> Result<()> {
    let mut rows = Vec::new();
    for p in &cli.reports {
        rows.extend(crate::spreadsheet::read_json_rows(p)?);
    }
    let caption = cli.caption.clone().unwrap_or_else(|| {
        let names: Vec<String> = cli
            .reports
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        caption(
            &Machine::detect(),
            &format!("mqperf plot {}", names.join(" ")),
        )
    });
    draw_file(&cli.out, &rows, &caption)
        .with_context(|| format!("cannot draw {}", cli.out.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_and_numbers() {
        assert_eq!(Format::of(Path::new("a/b.SVG")), Some(Format::Svg));
        assert_eq!(Format::of(Path::new("b.png")), Some(Format::Png));
        assert_eq!(Format::of(Path::new("b.pdf")), None);
        assert_eq!(Format::of(Path::new("svg")), None);
        assert_eq!(short(950.0), "950");
        assert_eq!(short(1500.0), "1.5k");
        assert_eq!(short(12_345.0), "12k");
        assert_eq!(short(2_500_000.0), "2.5M");
        assert_eq!(colour_hex("nats"), "#2CA02C");
    }
}
