//! Terminal progress bars for long jobs (bytes/s and ETA), hidden when stderr is not a terminal.

use std::sync::atomic::{AtomicBool, Ordering};

use fp4forge_builder::build::Progress;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Sizes the global rayon pool (`--threads`); `None` keeps one thread per core.
pub fn set_threads(threads: Option<usize>) -> anyhow::Result<()> {
    if let Some(n) = threads {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()
            .map_err(|e| anyhow::anyhow!("setting --threads {n}: {e}"))?;
    }
    Ok(())
}

/// Set by the Ctrl-C handler; long jobs poll it and stop cleanly.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Installs the Ctrl-C / SIGTERM handler (once per process).
pub fn install_interrupt_handler() {
    let _ = ctrlc::set_handler(|| INTERRUPTED.store(true, Ordering::SeqCst));
}

/// An indicatif bar that implements the builder's [`Progress`] and reports Ctrl-C as a
/// cancellation.
pub struct Bar(ProgressBar);

impl Bar {
    /// A byte-counting bar with a label.
    pub fn new(label: &str) -> Self {
        let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
        let style = ProgressStyle::with_template(
            "{prefix:>10} [{elapsed_precise}] {wide_bar} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} ETA {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        bar.set_prefix(label.to_string());
        Self(bar)
    }

    /// Removes the bar from the terminal.
    pub fn finish(&self) {
        self.0.finish_and_clear();
    }
}

impl Progress for Bar {
    fn start(&self, total_bytes: u64) {
        self.0.set_length(total_bytes);
    }

    fn advance(&self, bytes: u64) {
        self.0.inc(bytes);
    }

    fn cancelled(&self) -> bool {
        INTERRUPTED.load(Ordering::SeqCst)
    }
}
