//! Reports as aligned text tables.

use std::fmt;

use super::report::{Basis, Comparison, Report};
use super::table::{bytes, context, thousands, Table};

fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

fn header(r: &Report, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    let m = &r.model;
    let basis = match r.basis {
        Basis::Config => "tensor set derived from config.json",
        Basis::Headers => "tensor set read from safetensors headers",
    };
    writeln!(f, "{} ({basis})", r.source)?;
    let arch = m.architectures.first().map_or("", String::as_str);
    write!(f, "{} {arch}: {} layers", m.model_type, m.layers)?;
    if m.sliding_attention_layers > 0 {
        write!(
            f,
            " ({} full + {} sliding, window {})",
            m.full_attention_layers,
            m.sliding_attention_layers,
            m.sliding_window.unwrap_or(0)
        )?;
    }
    writeln!(
        f,
        ", hidden {}, head_dim {}, vocab {}, {}{}",
        m.hidden_size,
        m.head_dim,
        m.vocab_size,
        m.dtype.to_lowercase(),
        if m.tie_word_embeddings {
            ", tied lm_head"
        } else {
            ""
        }
    )?;
    if let (Some(e), Some(k)) = (m.experts, m.experts_per_token) {
        writeln!(
            f,
            "MoE: {} layers x {e} experts, top-{k}; {} dense MLP layer(s)",
            m.moe_layers, m.dense_mlp_layers
        )?;
    }
    if let Some(q) = &r.quantization {
        for g in &q.groups {
            writeln!(
                f,
                "quantized: {} {} <- {}",
                g.name,
                g.scheme,
                g.targets.join(", ")
            )?;
        }
        writeln!(
            f,
            "ignore: {} entries; kv cache: {}",
            q.ignore.len(),
            q.kv_cache_bits
                .map_or("model dtype".to_string(), |b| format!("{b}-bit float"))
        )?;
    }
    Ok(())
}

fn kv_tables(r: &Report, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    let kv = &r.kv_cache;
    let mut t = Table::new(&[
        "kv cache",
        "layers",
        "window",
        "B/token/layer bf16",
        "fp8",
        "B/token bf16",
        "fp8",
        "cap/seq bf16",
        "fp8",
    ]);
    for g in &kv.groups {
        let opt = |v: Option<u64>, fmt: &dyn Fn(u64) -> String| v.map_or("-".into(), fmt);
        t.row(vec![
            g.kind.to_string(),
            g.layers.to_string(),
            opt(g.window, &|w| w.to_string()),
            opt(g.per_layer_bytes_bf16, &thousands),
            opt(g.per_layer_bytes_bf16.map(|b| b / 2), &thousands),
            thousands(g.bytes_per_token_bf16),
            thousands(g.bytes_per_token_fp8),
            opt(g.cap_bytes_bf16, &|b| bytes(b as f64)),
            opt(g.cap_bytes_fp8, &|b| bytes(b as f64)),
        ]);
    }
    t.render(f)?;
    writeln!(f)?;
    let mut t = Table::new(&["context", "kv bf16", "kv fp8"]);
    for c in &kv.contexts {
        t.row(vec![
            context(c.context),
            bytes(c.bytes_bf16 as f64),
            bytes(c.bytes_fp8 as f64),
        ]);
    }
    t.render(f)
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        header(self, f)?;
        writeln!(f)?;
        let tot = &self.totals;
        let mut t = Table::new(&[
            "component",
            "precision",
            "tensors",
            "params",
            "bytes",
            "bytes/token",
            "share",
        ])
        .left(&[1]);
        for r in &self.components {
            t.row(vec![
                r.component.to_string(),
                r.precision.to_string(),
                thousands(r.tensors),
                thousands(r.params),
                bytes(r.bytes as f64),
                bytes(r.bytes_per_token),
                pct(r.bytes_per_token / tot.bytes_per_token),
            ]);
        }
        t.rule();
        t.row(vec![
            "total".into(),
            String::new(),
            thousands(tot.tensors),
            thousands(tot.params),
            bytes(tot.bytes as f64),
            bytes(tot.bytes_per_token),
            pct(1.0),
        ]);
        t.render(f)?;
        writeln!(
            f,
            "attention (q,k,v,o,gate): {} params, {}/token = {} of weight bytes per token",
            thousands(tot.attention_params),
            bytes(tot.attention_bytes_per_token),
            pct(tot.attention_share)
        )?;
        writeln!(
            f,
            "active params per token: {} ({} with the embedding table)",
            thousands(tot.active_params.round() as u64),
            thousands(tot.active_params_with_embedding.round() as u64)
        )?;
        writeln!(f)?;
        kv_tables(self, f)?;
        if let Some(first) = self.roofline.first() {
            writeln!(f)?;
            writeln!(
                f,
                "decode ceiling at batch 1, tok/s = bandwidth / (weight bytes + {} KV bytes at context)",
                first.kv_dtype.label()
            )?;
            let mut head = vec!["device".to_string(), "GB/s".to_string()];
            head.extend(first.ceilings.iter().map(|c| context(c.context)));
            let mut t = Table::new(&head);
            for row in &self.roofline {
                let mut cells = vec![
                    row.hardware.name.clone(),
                    format!("{}", row.hardware.bandwidth_gbps),
                ];
                cells.extend(row.ceilings.iter().map(|c| format!("{:.1}", c.tok_s)));
                t.row(cells);
            }
            t.render(f)?;
        }
        Ok(())
    }
}

impl fmt::Display for Comparison {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (b, a) = (&self.before, &self.after);
        writeln!(f, "before: {}", b.source)?;
        writeln!(f, "after:  {}", a.source)?;
        writeln!(f)?;
        let mut t = Table::new(&[
            "component",
            "before",
            "bytes",
            "bytes/token",
            "after",
            "bytes",
            "bytes/token",
            "after/before",
        ])
        .left(&[1, 4]);
        let ratio = |x: f64, y: f64| {
            if x == 0.0 {
                "-".to_string()
            } else {
                format!("{:.3}", y / x)
            }
        };
        for c in &self.components {
            t.row(vec![
                c.component.to_string(),
                c.before_precision.clone(),
                bytes(c.before_bytes as f64),
                bytes(c.before_bytes_per_token),
                c.after_precision.clone(),
                bytes(c.after_bytes as f64),
                bytes(c.after_bytes_per_token),
                ratio(c.before_bytes_per_token, c.after_bytes_per_token),
            ]);
        }
        t.rule();
        t.row(vec![
            "total".into(),
            String::new(),
            bytes(b.totals.bytes as f64),
            bytes(b.totals.bytes_per_token),
            String::new(),
            bytes(a.totals.bytes as f64),
            bytes(a.totals.bytes_per_token),
            ratio(b.totals.bytes_per_token, a.totals.bytes_per_token),
        ]);
        t.render(f)?;
        writeln!(
            f,
            "footprint:       {} -> {} ({}{}, x{:.3})",
            bytes(b.totals.bytes as f64),
            bytes(a.totals.bytes as f64),
            if self.footprint_delta_bytes >= 0 {
                "+"
            } else {
                ""
            },
            bytes(self.footprint_delta_bytes as f64),
            self.footprint_ratio
        )?;
        writeln!(
            f,
            "bytes per token: {} -> {} ({}{}, x{:.3}; decode ceiling x{:.3})",
            bytes(b.totals.bytes_per_token),
            bytes(a.totals.bytes_per_token),
            if self.bytes_per_token_delta >= 0.0 {
                "+"
            } else {
                ""
            },
            bytes(self.bytes_per_token_delta),
            self.bytes_per_token_ratio,
            1.0 / self.bytes_per_token_ratio
        )?;
        writeln!(
            f,
            "attention share: {} -> {}",
            pct(b.totals.attention_share),
            pct(a.totals.attention_share)
        )?;
        writeln!(f)?;
        writeln!(
            f,
            "decode ceiling at batch 1, tok/s before -> after (weights + {} / {} KV at context)",
            b.kv_cache.dtype.label(),
            a.kv_cache.dtype.label()
        )?;
        let mut head = vec!["device".to_string(), "GB/s".to_string()];
        head.extend(self.speedup.iter().map(|s| context(s.context)));
        let mut t = Table::new(&head);
        for (rb, ra) in b.roofline.iter().zip(&a.roofline) {
            let mut cells = vec![
                rb.hardware.name.clone(),
                format!("{}", rb.hardware.bandwidth_gbps),
            ];
            for s in &self.speedup {
                let tok = |row: &super::hardware::RooflineRow| {
                    row.ceilings
                        .iter()
                        .find(|c| c.context == s.context)
                        .map_or(f64::NAN, |c| c.tok_s)
                };
                cells.push(format!("{:.1} -> {:.1}", tok(rb), tok(ra)));
            }
            t.row(cells);
        }
        t.rule();
        let mut cells = vec!["speedup".to_string(), String::new()];
        cells.extend(self.speedup.iter().map(|s| format!("x{:.3}", s.speedup)));
        t.row(cells);
        t.render(f)
    }
}
