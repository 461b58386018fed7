//! Progress on the terminal: the library reports [`RunEvent`]s, this turns
//! them into indicatif bars on stderr.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use sluice_pipeline::RunEvent;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A bar with `template`, or a hidden one when `show` is false.
pub fn bar(show: bool, template: &str) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    bar
}

/// Which bar is showing.
#[derive(Default)]
struct Bars {
    current: Option<(Kind, ProgressBar)>,
}

#[derive(Clone, PartialEq)]
enum Kind {
    Loading,
    Ingest(String),
    Steps,
}

/// A callback that draws a run's progress (nothing when `show` is false).
pub fn run_progress(show: bool) -> Arc<dyn Fn(RunEvent) + Send + Sync> {
    let bars = Mutex::new(Bars::default());
    Arc::new(move |event| {
        if !show {
            return;
        }
        let mut bars = bars.lock().unwrap_or_else(|p| p.into_inner());
        let (kind, template) = match &event {
            RunEvent::Loading(_) => (Kind::Loading, "{spinner} {msg}"),
            RunEvent::Ingest { port, file, .. } => (
                Kind::Ingest(format!("{} → {port}", file.display())),
                "appending {msg} {wide_bar} {bytes}/{total_bytes}",
            ),
            RunEvent::Steps { .. } => (Kind::Steps, "steps {msg} {wide_bar} {pos}/{len} events"),
            RunEvent::Exporting => {
                if let Some((_, b)) = bars.current.take() {
                    b.finish_and_clear();
                }
                return;
            }
        };
        if bars.current.as_ref().is_none_or(|(k, _)| *k != kind) {
            if let Some((_, b)) = bars.current.take() {
                b.finish_and_clear();
            }
            let b = bar(true, template);
            if let Kind::Ingest(label) = &kind {
                b.set_message(label.clone());
            }
            if kind == Kind::Loading {
                b.enable_steady_tick(Duration::from_millis(100));
            }
            bars.current = Some((kind, b));
        }
        let Some((_, b)) = &bars.current else { return };
        match event {
            RunEvent::Loading(path) => b.set_message(format!("loading {}", path.display())),
            RunEvent::Ingest { done, size, .. } => {
                b.set_length(size);
                b.set_position(done);
            }
            RunEvent::Steps {
                steps,
                consumed,
                total,
            } => {
                b.set_length(total);
                b.set_position(consumed);
                b.set_message(steps.to_string());
            }
            RunEvent::Exporting => {}
        }
    })
}
