//! Where a step leaves the GPU idle: the kernels (and copies) of a run of steps, from CUPTI's
//! activity records, cut into steps by host-side marks in the same clock, and summarised per step:
//! the wall time between marks, the time some GPU work ran (the union of the spans: work that
//! overlaps, as PDL's prologues do, counts once), the GPU's idle time inside the step (between its
//! first and last span) and at its edges (from the step's mark to its first span: the host's
//! launch lead; from its last span to the next mark: the host's turnaround), and the gaps by size.
//! The question it answers: what CUDA graphs (no host launches, no launch gaps) could buy a step.
//!
//! [`summarize`] is plain arithmetic on spans; [`KernelTrace`] (feature `cuda`) records them.

/// One piece of GPU work: a kernel or a copy, with its times in nanoseconds (CUPTI's clock).
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    /// The kernel's name, or `[copy]` for a memory copy and `[set]` for a memset.
    pub name: String,
    /// When it started.
    pub start: u64,
    /// When it ended (≥ start).
    pub end: u64,
}

/// Idle gaps inside steps, counted by size (upper bounds in microseconds; the last bucket is
/// open): how much of the idle time is many small launch gaps and how much a few long waits.
pub const GAP_BUCKETS_US: [f64; 5] = [1.0, 2.0, 5.0, 20.0, f64::INFINITY];

/// One gap inside a step: where the GPU had nothing to run.
#[derive(Clone, Debug, PartialEq)]
pub struct Gap {
    /// Its length in nanoseconds.
    pub ns: u64,
    /// The work that ended last before it.
    pub after: String,
    /// The work that started after it.
    pub before: String,
}

/// One kernel name's share of a step (means over the steps).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NameTime {
    /// The kernel's name (or `[copy]`, `[set]`).
    pub name: String,
    /// Launches a step.
    pub count: f64,
    /// Its spans' lengths a step, ms. Spans overlap: under PDL a kernel starts before its
    /// predecessor ends and waits, so this counts some of the predecessor's time as well.
    pub span_ms: f64,
    /// The busy time it added a step, ms: each span's part after the end of all work that
    /// started before it (the step's busy time, divided among the kernels without overlap).
    pub busy_ms: f64,
}

/// What a run of steps did on the GPU, per step (means over the steps).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Timeline {
    /// Steps summarised (each between two marks, with at least one span).
    pub steps: usize,
    /// Host wall time from one mark to the next, ms.
    pub wall_ms: f64,
    /// Time some work ran, ms.
    pub busy_ms: f64,
    /// Idle time between a step's first and last span, ms.
    pub inner_idle_ms: f64,
    /// From the step's mark to its first span, ms (the host's first launch and the GPU's start).
    pub lead_ms: f64,
    /// From the step's last span to the next mark, ms (the result's way to the host, the host's
    /// work between steps).
    pub tail_ms: f64,
    /// Kernels a step.
    pub kernels: f64,
    /// Copies and memsets a step.
    pub copies: f64,
    /// Per bucket of [`GAP_BUCKETS_US`]: gaps a step, and their idle time a step in ms.
    pub gap_buckets: [(f64, f64); 5],
    /// The longest gaps of all steps, longest first (at most 8).
    pub longest: Vec<Gap>,
    /// Per kernel name, most busy time first.
    pub by_name: Vec<NameTime>,
}

/// Summarises `spans` (any order) over the steps between consecutive `marks` (ascending, in the
/// spans' clock): a span belongs to the step in which it started; spans before the first mark or
/// after the last are ignored, as are steps without spans.
pub fn summarize(spans: &[Span], marks: &[u64]) -> Timeline {
    let mut t = Timeline::default();
    let mut sorted: Vec<&Span> = spans.iter().collect();
    sorted.sort_by_key(|s| (s.start, s.end));
    let mut gaps: Vec<Gap> = Vec::new();
    // per name: launches, span time, busy time added (ns)
    let mut names: std::collections::BTreeMap<&str, (usize, u64, u64)> = Default::default();
    for w in marks.windows(2) {
        let (m0, m1) = (w[0], w[1]);
        let step: Vec<&Span> = sorted
            .iter()
            .copied()
            .filter(|s| s.start >= m0 && s.start < m1)
            .collect();
        let Some(first) = step.first() else { continue };
        t.steps += 1;
        t.wall_ms += (m1 - m0) as f64 / 1e6;
        t.lead_ms += (first.start - m0) as f64 / 1e6;
        let (mut end, mut last) = (first.start, first);
        for s in &step {
            if s.start > end {
                gaps.push(Gap {
                    ns: s.start - end,
                    after: last.name.clone(),
                    before: s.name.clone(),
                });
                t.inner_idle_ms += (s.start - end) as f64 / 1e6;
            }
            let e = names.entry(&s.name).or_default();
            e.0 += 1;
            e.1 += s.end - s.start;
            if s.end > end {
                let added = s.end - s.start.max(end);
                t.busy_ms += added as f64 / 1e6;
                e.2 += added;
                end = s.end;
                last = s;
            }
            if s.name.starts_with('[') {
                t.copies += 1.0;
            } else {
                t.kernels += 1.0;
            }
        }
        t.tail_ms += m1.saturating_sub(end) as f64 / 1e6;
    }
    if t.steps == 0 {
        return t;
    }
    let n = t.steps as f64;
    for v in [
        &mut t.wall_ms,
        &mut t.busy_ms,
        &mut t.inner_idle_ms,
        &mut t.lead_ms,
        &mut t.tail_ms,
        &mut t.kernels,
        &mut t.copies,
    ] {
        *v /= n;
    }
    for g in &gaps {
        let us = g.ns as f64 / 1e3;
        let b = GAP_BUCKETS_US.iter().position(|&hi| us < hi).unwrap_or(4);
        t.gap_buckets[b].0 += 1.0 / n;
        t.gap_buckets[b].1 += g.ns as f64 / 1e6 / n;
    }
    gaps.sort_by_key(|g| std::cmp::Reverse(g.ns));
    gaps.truncate(8);
    t.longest = gaps;
    t.by_name = names
        .into_iter()
        .map(|(k, (c, span, busy))| NameTime {
            name: k.to_string(),
            count: c as f64 / n,
            span_ms: span as f64 / 1e6 / n,
            busy_ms: busy as f64 / 1e6 / n,
        })
        .collect();
    t.by_name.sort_by(|a, b| b.busy_ms.total_cmp(&a.busy_ms));
    t
}

impl Timeline {
    /// The summary as text: one block, `label` first (e.g. the batch size).
    pub fn render(&self, label: &str) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        if self.steps == 0 {
            let _ = writeln!(s, "timeline {label}: no GPU work between the marks");
            return s;
        }
        let pct = |v: f64| 100.0 * v / self.wall_ms;
        let _ = writeln!(
            s,
            "timeline {label}: {} steps, {:.3} ms a step: GPU busy {:.3} ({:.1}%), idle inside \
             the step {:.3} ({:.1}%), lead {:.3} ({:.1}%), tail {:.3} ({:.1}%); {:.1} kernels and \
             {:.1} copies a step",
            self.steps,
            self.wall_ms,
            self.busy_ms,
            pct(self.busy_ms),
            self.inner_idle_ms,
            pct(self.inner_idle_ms),
            self.lead_ms,
            pct(self.lead_ms),
            self.tail_ms,
            pct(self.tail_ms),
            self.kernels,
            self.copies
        );
        let mut lo = 0.0;
        let _ = write!(s, "  gaps a step:");
        for (hi, (count, ms)) in GAP_BUCKETS_US.iter().zip(self.gap_buckets) {
            let range = if hi.is_finite() {
                format!("{lo}-{hi} us")
            } else {
                format!(">= {lo} us")
            };
            let _ = write!(s, " {range}: {count:.1} ({:.1} us);", 1e3 * ms);
            lo = *hi;
        }
        let _ = writeln!(s);
        for g in &self.longest {
            let _ = writeln!(
                s,
                "  gap {:>8.1} us  {} -> {}",
                g.ns as f64 / 1e3,
                g.after,
                g.before
            );
        }
        let _ = writeln!(
            s,
            "  {:>10} {:>10} {:>8}  kernel (busy: the step's busy time it added)",
            "busy us", "span us", "launches"
        );
        for k in self.by_name.iter().take(16) {
            let _ = writeln!(
                s,
                "  {:>10.1} {:>10.1} {:>8.1}  {}",
                1e3 * k.busy_ms,
                1e3 * k.span_ms,
                k.count,
                k.name
            );
        }
        s
    }
}

#[cfg(feature = "cuda")]
pub use trace::KernelTrace;

#[cfg(feature = "cuda")]
mod trace {
    //! CUPTI's activity API: kernels (concurrent kind: no serialisation), copies and memsets.
    use super::Span;
    use cudarc::cupti::result::activity;
    use cudarc::cupti::sys;
    use std::alloc::{alloc, dealloc, Layout};
    use std::sync::Mutex;

    const BUFFER_BYTES: usize = 8 << 20;
    const BUFFER_ALIGN: usize = 8;
    /// Spans delivered by CUPTI's buffer callbacks (its own threads), taken by
    /// [`KernelTrace::finish`].
    static SPANS: Mutex<Vec<Span>> = Mutex::new(Vec::new());
    const KINDS: [sys::CUpti_ActivityKind; 3] = [
        sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
        sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMCPY,
        sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMSET,
    ];

    fn layout() -> Layout {
        // (constant, valid: a power-of-two alignment that divides the size)
        Layout::from_size_align(BUFFER_BYTES, BUFFER_ALIGN).expect("a valid layout")
    }

    unsafe extern "C" fn buffer_requested(buffer: *mut *mut u8, size: *mut usize, max: *mut usize) {
        // SAFETY: CUPTI passes valid out-pointers; the buffer is freed in buffer_completed.
        unsafe {
            *buffer = alloc(layout());
            *size = if (*buffer).is_null() { 0 } else { BUFFER_BYTES };
            *max = 0;
        }
    }

    unsafe extern "C" fn buffer_completed(
        _ctx: cudarc::driver::sys::CUcontext,
        _stream: u32,
        buffer: *mut u8,
        _size: usize,
        valid: usize,
    ) {
        let mut out = Vec::new();
        let mut rec: *mut sys::CUpti_Activity = std::ptr::null_mut();
        // SAFETY: `buffer` is one of ours, filled by CUPTI up to `valid` bytes; each record
        // starts with its kind, and the kernel and copy records' fields read here have the same
        // offsets in every record version since CUDA 11.
        unsafe {
            while activity::get_next_record(buffer, valid, &mut rec).is_ok() {
                let kind = *(rec as *const u32);
                if kind == sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL as u32 {
                    let k = &*(rec as *const sys::CUpti_ActivityKernel9);
                    let name = if k.name.is_null() {
                        "?".to_string()
                    } else {
                        std::ffi::CStr::from_ptr(k.name)
                            .to_string_lossy()
                            .into_owned()
                    };
                    out.push(Span {
                        name,
                        start: k.start,
                        end: k.end,
                    });
                } else if kind == sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMCPY as u32 {
                    let c = &*(rec as *const sys::CUpti_ActivityMemcpy5);
                    out.push(Span {
                        name: "[copy]".into(),
                        start: c.start,
                        end: c.end,
                    });
                } else if kind == sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMSET as u32 {
                    let c = &*(rec as *const sys::CUpti_ActivityMemset4);
                    out.push(Span {
                        name: "[set]".into(),
                        start: c.start,
                        end: c.end,
                    });
                }
            }
            if !buffer.is_null() {
                dealloc(buffer, layout());
            }
        }
        if let Ok(mut spans) = SPANS.lock() {
            spans.extend(out);
        }
    }

    fn check(what: &str, r: Result<(), cudarc::cupti::result::CuptiError>) -> Result<(), String> {
        r.map_err(|e| format!("CUPTI {what}: {e:?}"))
    }

    /// Records GPU work from [`KernelTrace::start`] to [`KernelTrace::finish`], with host marks
    /// ([`KernelTrace::mark`]) in the same clock. One at a time in a process. Needs CUPTI's
    /// library (`libcupti.so`, on the loader's path).
    pub struct KernelTrace {
        marks: Vec<u64>,
    }

    impl KernelTrace {
        /// Starts recording (after the CUDA context exists).
        pub fn start() -> Result<Self, String> {
            // SAFETY: only tries to open the library.
            if !unsafe { sys::is_culib_present() } {
                return Err(
                    "CUPTI's library (libcupti.so) is not on the loader's path: add its \
                            folder (e.g. the CUDA toolkit's extras/CUPTI/lib64) to \
                            LD_LIBRARY_PATH"
                        .into(),
                );
            }
            if let Ok(mut spans) = SPANS.lock() {
                spans.clear();
            }
            check(
                "register callbacks",
                activity::register_callbacks(Some(buffer_requested), Some(buffer_completed)),
            )?;
            for k in KINDS {
                check("enable", activity::enable(k))?;
            }
            Ok(Self { marks: Vec::new() })
        }

        /// Marks now (a step's start, or the last step's end) in CUPTI's clock.
        pub fn mark(&mut self) -> Result<(), String> {
            let mut t = 0u64;
            // SAFETY: a valid out-pointer.
            let r = unsafe { sys::cuptiGetTimestamp(&mut t) };
            if r != sys::CUptiResult::CUPTI_SUCCESS {
                return Err(format!("CUPTI timestamp: {r:?}"));
            }
            self.marks.push(t);
            Ok(())
        }

        /// Stops recording (call after the last step's results are on the host) and returns the
        /// spans and the marks.
        pub fn finish(self) -> Result<(Vec<Span>, Vec<u64>), String> {
            for k in KINDS {
                check("disable", activity::disable(k))?;
            }
            // CUPTI_ACTIVITY_FLAG_FLUSH_FORCED (1): also the buffers not yet full.
            check("flush", activity::flush_all(1))?;
            let spans = SPANS
                .lock()
                .map(|mut s| std::mem::take(&mut *s))
                .map_err(|_| "CUPTI: the span list was poisoned".to_string())?;
            Ok((spans, self.marks))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(name: &str, start: u64, end: u64) -> Span {
        Span {
            name: name.into(),
            start,
            end,
        }
    }

    #[test]
    fn steps_union_gaps_and_edges() {
        // Step 1 (marks 500..10_000): a 500 ns lead, two overlapping kernels (PDL), a 500 ns gap,
        // a copy, a 3_000 ns tail. Step 2 (10_000..20_000): one kernel, a 5_000 ns gap, another
        // kernel, a 2_000 ns tail. A span before the first mark is ignored.
        let spans = vec![
            span("late", 16_000, 18_000),
            span("a", 1_000, 3_000),
            span("b", 2_500, 4_000),
            span("[copy]", 4_500, 7_000),
            span("early", 0, 0),
            span("c", 10_500, 11_000),
        ];
        let t = summarize(&spans, &[500, 10_000, 20_000]);
        assert_eq!(t.steps, 2);
        // per step: wall (9_500 + 10_000) / 2
        assert!((t.wall_ms - 9.75e-3).abs() < 1e-12);
        // busy: step 1: 1_000..4_000 (union) + 2_500 = 5_500; step 2: 500 + 2_000
        assert!((t.busy_ms - (5_500.0 + 2_500.0) / 2.0 / 1e6).abs() < 1e-12);
        // inner idle: 500, then 5_000
        assert!((t.inner_idle_ms - 5_500.0 / 2.0 / 1e6).abs() < 1e-12);
        // lead: 500, 500; tail: 3_000, 2_000
        assert!((t.lead_ms - 500.0 / 1e6).abs() < 1e-12);
        assert!((t.tail_ms - 2_500.0 / 1e6).abs() < 1e-12);
        assert_eq!((t.kernels, t.copies), (2.0, 0.5));
        // 500 ns: the first bucket; 5 us: the 5-20 us bucket
        assert_eq!(t.gap_buckets[0].0, 0.5);
        assert_eq!(t.gap_buckets[3].0, 0.5);
        assert_eq!(
            t.longest[0],
            Gap {
                ns: 5_000,
                after: "c".into(),
                before: "late".into()
            }
        );
        // the gap before the copy follows b (the span that ended last), not a
        assert_eq!(t.longest[1].after, "b");
        // busy added: a 2_000 (its own), b 1_000 (after a's end), the copy 2_500, c 500,
        // late 2_000; b's span is 1_500
        let k = |n: &str| {
            t.by_name
                .iter()
                .find(|k| k.name == n)
                .cloned()
                .unwrap_or_default()
        };
        assert_eq!(t.by_name[0].name, "[copy]");
        assert!((k("b").busy_ms - 1_000.0 / 2.0 / 1e6).abs() < 1e-12);
        assert!((k("b").span_ms - 1_500.0 / 2.0 / 1e6).abs() < 1e-12);
        assert!((k("a").busy_ms - 2_000.0 / 2.0 / 1e6).abs() < 1e-12);
        let added: f64 = t.by_name.iter().map(|k| k.busy_ms).sum();
        assert!((added - t.busy_ms).abs() < 1e-12);
        // busy + inner idle + lead + tail = wall
        let sum = t.busy_ms + t.inner_idle_ms + t.lead_ms + t.tail_ms;
        assert!((sum - t.wall_ms).abs() < 1e-12);
        assert!(t.render("4 rows").contains("2 steps"));
    }

    #[test]
    fn no_spans_no_steps() {
        let t = summarize(&[span("a", 5, 6)], &[10, 20]);
        assert_eq!(t.steps, 0);
        assert!(t.render("x").contains("no GPU work"));
    }
}
