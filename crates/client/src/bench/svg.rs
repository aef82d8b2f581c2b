//! A hand-written SVG plot of a [`BenchReport`]: aggregate throughput vs concurrency, latency vs
//! concurrency, and single-stream decode speed vs prompt length. Plain polylines, axes and labels;
//! no dependencies.

use std::fmt::Write;

use super::report::BenchReport;

const PANEL_W: f64 = 420.0;
const PANEL_H: f64 = 320.0;
const MARGIN_L: f64 = 64.0;
const MARGIN_R: f64 = 16.0;
const MARGIN_T: f64 = 40.0;
const MARGIN_B: f64 = 48.0;
const COLORS: [&str; 4] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];

struct Series {
    name: &'static str,
    points: Vec<(f64, f64)>,
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A "nice" tick step (1, 2 or 5 × 10^k) giving about `target` ticks over `span`.
fn nice_step(span: f64, target: f64) -> f64 {
    if span.is_nan() || span <= 0.0 {
        return 1.0;
    }
    let raw = span / target;
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let nice = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * mag
}

fn fmt_tick(v: f64) -> String {
    if v >= 10_000.0 && v % 1000.0 == 0.0 {
        format!("{}k", v / 1000.0)
    } else if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// One panel at (`ox`, `oy`); x is log2-scaled (concurrency levels and prompt lengths grow
/// geometrically) with ticks at the data's x values.
fn panel(
    out: &mut String,
    ox: f64,
    oy: f64,
    title: &str,
    xlabel: &str,
    ylabel: &str,
    series: &[Series],
) {
    let pw = PANEL_W - MARGIN_L - MARGIN_R;
    let ph = PANEL_H - MARGIN_T - MARGIN_B;
    let (px, py) = (ox + MARGIN_L, oy + MARGIN_T);
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" font-size="14" font-weight="bold" text-anchor="middle">{}</text>"#,
        ox + PANEL_W / 2.0,
        oy + 22.0,
        esc(title)
    );
    let pts: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|s| s.points.iter().copied())
        .filter(|(x, y)| x.is_finite() && y.is_finite() && *x > 0.0)
        .collect();
    let _ = writeln!(
        out,
        r##"<rect x="{px:.1}" y="{py:.1}" width="{pw:.1}" height="{ph:.1}" fill="none" stroke="#444"/>"##
    );
    if pts.is_empty() {
        let _ = writeln!(
            out,
            r##"<text x="{:.1}" y="{:.1}" font-size="12" text-anchor="middle" fill="#888">no data</text>"##,
            px + pw / 2.0,
            py + ph / 2.0
        );
        return;
    }
    let lx: Vec<f64> = pts.iter().map(|p| p.0.log2()).collect();
    let (mut xmin, mut xmax) = (
        lx.iter().copied().fold(f64::INFINITY, f64::min),
        lx.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    );
    if xmax - xmin < 1e-9 {
        xmin -= 1.0;
        xmax += 1.0;
    }
    let ymax_data = pts.iter().map(|p| p.1).fold(0.0f64, f64::max);
    let step = nice_step(ymax_data.max(1e-9) * 1.05, 5.0);
    let ymax = (ymax_data * 1.05 / step).ceil().max(1.0) * step;
    let sx = |x: f64| px + (x.log2() - xmin) / (xmax - xmin) * pw;
    let sy = |y: f64| py + ph - y / ymax * ph;
    // y grid and labels
    let mut y = 0.0;
    while y <= ymax + step * 1e-6 {
        let yy = sy(y);
        let _ = writeln!(
            out,
            r##"<line x1="{px:.1}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" font-size="11" text-anchor="end">{}</text>"##,
            px + pw,
            px - 6.0,
            yy + 4.0,
            fmt_tick(y)
        );
        y += step;
    }
    // x ticks at the data's x values
    let mut xs: Vec<f64> = pts.iter().map(|p| p.0).collect();
    xs.sort_by(|a, b| a.total_cmp(b));
    xs.dedup();
    for x in xs {
        let xx = sx(x);
        let _ = writeln!(
            out,
            r##"<line x1="{xx:.1}" y1="{:.1}" x2="{xx:.1}" y2="{:.1}" stroke="#444"/><text x="{xx:.1}" y="{:.1}" font-size="11" text-anchor="middle">{}</text>"##,
            py + ph,
            py + ph + 5.0,
            py + ph + 18.0,
            fmt_tick(x)
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" font-size="12" text-anchor="middle">{}</text>"#,
        px + pw / 2.0,
        py + ph + 38.0,
        esc(xlabel)
    );
    let (yx, yy) = (ox + 16.0, py + ph / 2.0);
    let _ = writeln!(
        out,
        r#"<text x="{yx:.1}" y="{yy:.1}" font-size="12" text-anchor="middle" transform="rotate(-90 {yx:.1} {yy:.1})">{}</text>"#,
        esc(ylabel)
    );
    // series and legend
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let p: Vec<String> = s
            .points
            .iter()
            .filter(|(x, y)| x.is_finite() && y.is_finite() && *x > 0.0)
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
            .collect();
        if p.is_empty() {
            continue;
        }
        let _ = writeln!(
            out,
            r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"/>"#,
            p.join(" ")
        );
        for xy in &p {
            let (cx, cy) = xy.split_once(',').unwrap_or(("0", "0"));
            let _ = writeln!(out, r#"<circle cx="{cx}" cy="{cy}" r="3" fill="{color}"/>"#);
        }
        let ly = py + 14.0 + 16.0 * i as f64;
        let _ = writeln!(
            out,
            r#"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{color}" stroke-width="2"/><text x="{:.1}" y="{:.1}" font-size="11">{}</text>"#,
            px + 8.0,
            ly - 4.0,
            px + 26.0,
            ly - 4.0,
            px + 30.0,
            ly,
            esc(s.name)
        );
    }
}

/// The report as a standalone SVG document (three panels side by side).
pub fn render_svg(report: &BenchReport) -> String {
    let width = 3.0 * PANEL_W;
    let height = PANEL_H + 30.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="sans-serif">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r##"<text x="8" y="{:.1}" font-size="11" fill="#555">{} @ {} — {} tokens/request, prompts: {}</text>"##,
        height - 10.0,
        esc(&report.model),
        esc(&report.url),
        report.max_tokens,
        esc(&report.prompts)
    );
    let sweep = |f: fn(&super::SweepPoint) -> f64| -> Vec<(f64, f64)> {
        report
            .sweep
            .iter()
            .filter(|p| p.requests > 0)
            .map(|p| (p.concurrency as f64, f(p)))
            .collect()
    };
    panel(
        &mut out,
        0.0,
        0.0,
        "Throughput vs concurrency",
        "concurrent streams",
        "tokens/s",
        &[
            Series {
                name: "aggregate output tok/s",
                points: sweep(|p| p.output_tok_s),
            },
            Series {
                name: "per-stream decode tok/s",
                points: sweep(|p| p.stream_decode_tok_s),
            },
        ],
    );
    panel(
        &mut out,
        PANEL_W,
        0.0,
        &format!("Latency vs concurrency (prompt {})", report.sweep_context),
        "concurrent streams",
        "milliseconds",
        &[
            Series {
                name: "TTFT p50",
                points: sweep(|p| p.ttft_ms.p50),
            },
            Series {
                name: "TPOT p50",
                points: sweep(|p| p.tpot_ms.p50),
            },
            Series {
                name: "ITL p99",
                points: sweep(|p| p.itl_ms.p99),
            },
        ],
    );
    panel(
        &mut out,
        2.0 * PANEL_W,
        0.0,
        "Single-stream decode vs context",
        "prompt tokens",
        "tokens/s",
        &[Series {
            name: "decode tok/s (median)",
            points: report
                .contexts
                .iter()
                .filter(|c| c.repetitions > 0)
                .map(|c| (c.context as f64, c.decode_tok_s))
                .collect(),
        }],
    );
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_steps() {
        assert_eq!(nice_step(100.0, 5.0), 20.0);
        assert_eq!(nice_step(7.0, 5.0), 2.0);
        assert_eq!(nice_step(0.9, 5.0), 0.2);
        assert_eq!(fmt_tick(65536.0), "65536");
        assert_eq!(fmt_tick(16000.0), "16k");
        assert_eq!(fmt_tick(0.25), "0.25");
        assert_eq!(esc("a<b&c"), "a&lt;b&amp;c");
    }
}
