//! What one parallel region costs on the CPU backend's thread pool, apart from its work: the
//! hand-off of a decode step's ops (a SmolLM2 step runs ~180 regions of 5–60 µs of work each).
//!
//! `cargo run --release -p fp4forge-lab --example fork_join_overhead -- [--threads N]
//! [--iters N]`
//!
//! For each (work per task, serial gap between regions) pair: the time per iteration of the
//! tasks run one after the other, then as one rayon region (`into_par_iter` on a pool of
//! `--threads`, default 2, entered once as the backend's `execute` does), then handed to helper
//! threads that spin on an epoch counter between regions (never sleeping: the floor a
//! spin-then-park pool could reach). Overhead = time per iteration minus the ideal (the gap plus
//! one task's work when the tasks run side by side).

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use fp4forge_lab::take_arg;
use rayon::prelude::*;

/// About `n` dependent floating-point steps of work.
fn work(n: usize) -> f32 {
    let mut s = 0f32;
    for i in 0..n {
        s += (i as f32).sqrt();
    }
    s
}

type Job = Arc<dyn Fn(usize) + Send + Sync>;

/// Helper threads that spin between jobs; the caller runs task 0 and waits for the rest.
struct Spinners {
    epoch: Arc<AtomicU64>,
    job: Arc<Mutex<Option<Job>>>,
    pending: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Spinners {
    fn new(helpers: usize) -> Self {
        let epoch = Arc::new(AtomicU64::new(0));
        let job: Arc<Mutex<Option<Job>>> = Arc::new(Mutex::new(None));
        let pending = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..helpers)
            .map(|h| {
                let (epoch, job, pending, stop) =
                    (epoch.clone(), job.clone(), pending.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut seen = 0;
                    loop {
                        let mut e = epoch.load(Ordering::Acquire);
                        while e == seen {
                            if stop.load(Ordering::Relaxed) {
                                return;
                            }
                            std::hint::spin_loop();
                            e = epoch.load(Ordering::Acquire);
                        }
                        seen = e;
                        let f = job.lock().ok().and_then(|j| j.clone());
                        if let Some(f) = f {
                            f(h + 1);
                        }
                        pending.fetch_sub(1, Ordering::Release);
                    }
                })
            })
            .collect();
        Self {
            epoch,
            job,
            pending,
            stop,
            threads,
        }
    }

    /// Runs `f(0)` here and `f(1..=helpers)` on the helpers; returns when all are done.
    fn run(&self, f: Job) {
        if let Ok(mut j) = self.job.lock() {
            *j = Some(f.clone());
        }
        self.pending.store(self.threads.len(), Ordering::Relaxed);
        self.epoch.fetch_add(1, Ordering::Release);
        f(0);
        while self.pending.load(Ordering::Acquire) > 0 {
            std::hint::spin_loop();
        }
    }
}

impl Drop for Spinners {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn main() -> Result<(), String> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let threads = take_arg(&mut args, "--threads", 2usize)?.max(2);
    let iters = take_arg(&mut args, "--iters", 5000usize)?.max(1);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| e.to_string())?;
    let per_iter = |f: &mut dyn FnMut()| {
        let t = Instant::now();
        for _ in 0..iters {
            f();
        }
        t.elapsed().as_secs_f64() * 1e6 / iters as f64
    };
    println!("{threads} threads, {iters} regions per measurement, µs per region");
    println!(
        "{:>8} {:>8} {:>9} {:>9} {:>9} {:>12} {:>12}",
        "task", "gap", "serial", "rayon", "spinning", "rayon over", "spin over"
    );
    for (task, gap) in [
        (2_000, 0),
        (5_000, 0),
        (5_000, 2_000),
        (5_000, 10_000),
        (20_000, 5_000),
    ] {
        let one = per_iter(&mut || {
            black_box(work(task));
        });
        let g = per_iter(&mut || {
            black_box(work(gap));
        });
        let serial = per_iter(&mut || {
            for _ in 0..threads {
                black_box(work(task));
            }
            black_box(work(gap));
        });
        let rayon = pool.install(|| {
            per_iter(&mut || {
                let v: Vec<f32> = (0..threads).into_par_iter().map(|_| work(task)).collect();
                black_box(v);
                black_box(work(gap));
            })
        });
        // (the helpers exist only for their own measurement: spinning, they hold a core)
        let spinners = Spinners::new(threads - 1);
        let job: Job = Arc::new(move |_| {
            black_box(work(task));
        });
        let spinning = per_iter(&mut || {
            spinners.run(job.clone());
            black_box(work(gap));
        });
        drop(spinners);
        let ideal = one + g;
        println!(
            "{one:>8.1} {g:>8.1} {serial:>9.1} {rayon:>9.1} {spinning:>9.1} {:>12.1} {:>12.1}",
            rayon - ideal,
            spinning - ideal
        );
    }
    Ok(())
}
