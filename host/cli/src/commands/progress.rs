//! Progress on the terminal: the library reports [`RunEvent`]s, this turns
//! them into indicatif bars on stderr.

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
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

/// The bars showing: the files being appended and the steps run at the
/// same time, one line each.
struct Bars {
    multi: MultiProgress,
    loading: Option<ProgressBar>,
    /// The files being appended (their labels) and their bars: the files
    /// of different ports are appended side by side.
    ingest: Vec<(String, ProgressBar)>,
    steps: Option<ProgressBar>,
}

impl Bars {
    /// A new bar with `template` under the others.
    fn add(&self, template: &str) -> ProgressBar {
        let b = self.multi.add(ProgressBar::no_length());
        if let Ok(style) = ProgressStyle::with_template(template) {
            b.set_style(style);
        }
        b
    }

    /// Clears every bar.
    fn clear(&mut self) {
        let ingest = self.ingest.drain(..).map(|(_, b)| b);
        for b in [self.loading.take(), self.steps.take()]
            .into_iter()
            .flatten()
            .chain(ingest)
        {
            b.finish_and_clear();
        }
    }
}

/// A callback that draws a run's progress (nothing when `show` is false).
pub fn run_progress(show: bool) -> Arc<dyn Fn(RunEvent) + Send + Sync> {
    let bars = Mutex::new(Bars {
        multi: MultiProgress::with_draw_target(ProgressDrawTarget::stderr()),
        loading: None,
        ingest: Vec::new(),
        steps: None,
    });
    Arc::new(move |event| {
        if !show {
            return;
        }
        let mut bars = bars.lock().unwrap_or_else(|p| p.into_inner());
        if !matches!(event, RunEvent::Loading(_))
            && let Some(b) = bars.loading.take()
        {
            b.finish_and_clear();
        }
        match event {
            RunEvent::Loading(path) => {
                if bars.loading.is_none() {
                    let b = bars.add("{spinner} {msg}");
                    b.enable_steady_tick(Duration::from_millis(100));
                    bars.loading = Some(b);
                }
                if let Some(b) = &bars.loading {
                    b.set_message(format!("loading {}", path.display()));
                }
            }
            RunEvent::Ingest {
                port,
                file,
                done,
                size,
                in_place,
            } => {
                let label = format!("{} → {port}", file.display());
                let at = match bars.ingest.iter().position(|(l, _)| *l == label) {
                    Some(at) => at,
                    None => {
                        let b = bars.add(match in_place {
                            true => "reading in place {msg} {wide_bar} {bytes}/{total_bytes}",
                            false => "appending {msg} {wide_bar} {bytes}/{total_bytes}",
                        });
                        b.set_message(label.clone());
                        bars.ingest.push((label, b));
                        bars.ingest.len() - 1
                    }
                };
                let b = &bars.ingest[at].1;
                b.set_length(size);
                b.set_position(done);
                if done >= size {
                    // This file is appended: its line goes.
                    bars.ingest.remove(at).1.finish_and_clear();
                }
            }
            RunEvent::Steps {
                steps,
                consumed,
                total,
            } => {
                if bars.steps.is_none() {
                    let b = bars.add("steps {msg} {wide_bar} {pos}/{len} events");
                    bars.steps = Some(b);
                }
                if let Some(b) = &bars.steps {
                    b.set_length(total);
                    b.set_position(consumed);
                    b.set_message(steps.to_string());
                }
            }
            RunEvent::Exporting => bars.clear(),
        }
    })
}
