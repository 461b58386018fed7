//! The report of `sluice bench`: the rows, the figures' formatting, the
//! rows several scenarios share, and the table (to stdout, and with
//! `--markdown` into a file between `<!-- bench:begin -->` and
//! `<!-- bench:end -->`, text around the markers kept) with an SVG chart of
//! the ratios.

use anyhow::Context;
use sluice_runtime::PipelineOptions;
use std::path::Path;
use std::time::Duration;

/// One line of the table.
#[derive(Debug, Clone)]
pub struct Row {
    /// The scenario.
    pub scenario: &'static str,
    /// Which case of it.
    pub case: String,
    /// The measured figure, with its unit.
    pub measured: String,
    /// The baseline figure, with its unit.
    pub baseline: String,
    /// measured / baseline (or the share the scenario defines).
    pub ratio: f64,
    /// The goal.
    pub goal: &'static str,
    /// Whether the goal is met (`None`: informational).
    pub met: Option<bool>,
}

/// Events per second of `events` in `d`.
pub(super) fn rate(events: u64, d: Duration) -> f64 {
    events as f64 / d.as_secs_f64().max(1e-9)
}

/// An event rate, in k or M events per second.
pub(super) fn fmt_rate(r: f64) -> String {
    if r >= 1e6 {
        format!("{:.2} M ev/s", r / 1e6)
    } else {
        format!("{:.0} k ev/s", r / 1e3)
    }
}

/// A duration, in µs or ms.
pub(super) fn fmt_time(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us >= 1000.0 {
        format!("{:.2} ms", us / 1000.0)
    } else {
        format!("{us:.1} µs")
    }
}

/// The checkpoint row: the pause (snapshots) against the interval.
pub(super) fn checkpoint_row(
    case: String,
    snapshots: Duration,
    total: Duration,
    step: Duration,
) -> Row {
    let interval = PipelineOptions::default().checkpoint_interval;
    Row {
        scenario: "checkpoint",
        case,
        measured: format!(
            "{} pause (snapshots; {} with the write, which overlaps the next steps)",
            fmt_time(snapshots),
            fmt_time(total)
        ),
        baseline: format!("{interval:?} interval; a step takes {}", fmt_time(step)),
        ratio: snapshots.as_secs_f64() / interval.as_secs_f64(),
        goal: "pause ≤ 10 % of the interval",
        met: Some(snapshots.as_secs_f64() <= 0.1 * interval.as_secs_f64()),
    }
}

/// The recovery row: open-to-live with `state_bytes` restored, per GiB
/// beyond a cold start.
pub(super) fn recovery_row(
    case: String,
    state_bytes: u64,
    restore: Duration,
    cold: Duration,
) -> Row {
    let gib = state_bytes as f64 / (1u64 << 30) as f64;
    let per_gib = restore.saturating_sub(cold).as_secs_f64() / gib.max(1e-12);
    Row {
        scenario: "recovery",
        case,
        measured: format!("{} to live ({per_gib:.2} s per GiB)", fmt_time(restore)),
        baseline: format!("{} cold start, empty state", fmt_time(cold)),
        ratio: restore.as_secs_f64() / cold.as_secs_f64().max(1e-9),
        goal: "≤ 2 s per GiB",
        met: (state_bytes >= 1 << 20).then_some(per_gib <= 2.0),
    }
}

/// The table as markdown.
pub fn table(rows: &[Row]) -> String {
    let mut s = String::from(
        "| scenario | case | measured | baseline | ratio | goal | met |\n|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let met = match r.met {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "–",
        };
        s.push_str(&format!(
            "| {} | {} | {} | {} | {:.3} | {} | {} |\n",
            r.scenario, r.case, r.measured, r.baseline, r.ratio, r.goal, met
        ));
    }
    s
}

/// The chart of the rows' ratios (SVG, log scale) at `path`.
fn chart(rows: &[Row], path: &Path) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (960, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    // Ratios span 0.001 (a boundary share) to thousands (recovery against
    // a cold start): a log scale keeps every bar readable.
    const FLOOR: f64 = 1e-3;
    let top = rows.iter().map(|r| r.ratio).fold(2.0f64, f64::max) * 2.0;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Sluice: ratio to the same-run baseline (log scale; bar n = table row n)",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..rows.len() as f64, (FLOOR..top).log_scale())
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(rows.len() + 1)
        .x_label_formatter(&|x| {
            let i = x.floor() as usize;
            rows.get(i)
                .map(|_| format!("{}", i + 1))
                .unwrap_or_default()
        })
        .y_desc("ratio")
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    chart
        .draw_series(rows.iter().enumerate().map(|(i, r)| {
            let color = match r.met {
                Some(true) => GREEN.mix(0.7),
                Some(false) => RED.mix(0.7),
                None => BLUE.mix(0.5),
            };
            Rectangle::new(
                [
                    (i as f64 + 0.15, FLOOR),
                    (i as f64 + 0.85, r.ratio.max(FLOOR)),
                ],
                color.filled(),
            )
        }))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}

/// This machine: cores, CPU model and memory.
fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|k| k.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb / 1024 / 1024);
    format!("{cores} cores ({cpu}), {mem} GiB")
}

/// Prints the table of `rows`; with `chart`, draws their ratios there;
/// with `markdown`, writes the table (and a link to the chart) into that
/// file between the markers. `quick` names the command in the markdown.
pub(super) fn write(
    rows: &[Row],
    quick: bool,
    markdown: Option<&Path>,
    chart_path: Option<&Path>,
) -> anyhow::Result<()> {
    let table = table(rows);
    println!("{table}");
    if let Some(chart_path) = chart_path {
        chart(rows, chart_path).with_context(|| chart_path.display().to_string())?;
    }
    if let Some(md) = markdown {
        let chart_ref = chart_path
            .and_then(|c| c.file_name())
            .map(|f| f.to_string_lossy().into_owned());
        let mut section = format!(
            "<!-- bench:begin -->\nMachine: {}. Command: `sluice bench{}`. Bars in the chart follow the table's rows.\n\n{table}",
            machine(),
            if quick { " --quick" } else { "" }
        );
        if let Some(c) = chart_ref {
            section.push_str(&format!("\n![ratios]({c})\n"));
        }
        section.push_str("<!-- bench:end -->");
        let old = std::fs::read_to_string(md).unwrap_or_default();
        let new = match (
            old.find("<!-- bench:begin -->"),
            old.find("<!-- bench:end -->"),
        ) {
            (Some(a), Some(b)) if a < b => format!(
                "{}{section}{}",
                &old[..a],
                &old[b + "<!-- bench:end -->".len()..]
            ),
            _ => format!("{old}{section}\n"),
        };
        std::fs::write(md, new).with_context(|| md.display().to_string())?;
    }
    Ok(())
}
