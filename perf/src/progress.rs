//! [`Progress`]: the progress bar (indicatif, on stderr), or nothing.
//!
//! Drawn only when asked for: `main` asks when stdout and stderr are terminals and `--json` is
//! off, so piped or machine-read output never carries escape sequences.

use indicatif::{ProgressBar, ProgressStyle};

/// A progress bar over messages processed, or a no-op. Cheap to clone; clones share the bar.
#[derive(Debug, Clone, Default)]
pub struct Progress(Option<ProgressBar>);

impl Progress {
    /// No bar.
    pub fn hidden() -> Progress {
        Progress(None)
    }

    /// A bar on stderr counting `total` messages.
    pub fn bar(total: u64) -> Progress {
        let bar = ProgressBar::new(total);
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {wide_bar} {human_pos}/{human_len} msgs ({per_sec}) {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        Progress(Some(bar))
    }

    /// Adds `n` processed messages.
    pub fn inc(&self, n: u64) {
        if let Some(b) = &self.0 {
            b.inc(n);
        }
    }

    /// Shows what is running (e.g. `string:1000/raw send run 2`).
    pub fn set_message(&self, m: String) {
        if let Some(b) = &self.0 {
            b.set_message(m);
        }
    }

    /// Runs `f` (which prints) with the bar hidden, so lines and bar do not mix.
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        match &self.0 {
            Some(b) => b.suspend(f),
            None => f(),
        }
    }

    /// Removes the bar.
    pub fn finish(&self) {
        if let Some(b) = &self.0 {
            b.finish_and_clear();
        }
    }
}
