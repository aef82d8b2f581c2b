//! The evaluation report: plain data that serializes as JSON and prints as a table.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::{MetricKind, MetricSpec};
use crate::stats::{nan_if_null, Estimate};
use crate::table::{num, Table};

/// One metric's value with its standard error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricValue {
    /// Metric name.
    pub metric: String,
    /// How it is shown.
    pub kind: MetricKind,
    /// Value (a proportion for accuracies, nats/token for NLL and KL).
    #[serde(deserialize_with = "nan_if_null")]
    pub value: f64,
    /// Standard error.
    #[serde(deserialize_with = "nan_if_null")]
    pub stderr: f64,
    /// Items it is computed over.
    pub n: usize,
    /// exp(value) for NLL metrics: the perplexity.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub perplexity: Option<f64>,
}

impl MetricValue {
    /// The value of `spec` from an estimate.
    pub fn new(spec: &MetricSpec, e: Estimate) -> Self {
        Self {
            metric: spec.name.clone(),
            kind: spec.kind,
            value: e.value,
            stderr: e.stderr,
            n: e.n,
            perplexity: (spec.kind == MetricKind::Nll).then(|| e.value.exp()),
        }
    }

    fn cell(&self) -> String {
        match self.kind {
            MetricKind::Accuracy => format!(
                "{} ± {}",
                num(100.0 * self.value, 2),
                num(100.0 * self.stderr, 2)
            ),
            MetricKind::Nll => format!(
                "{} ± {} (ppl {})",
                num(self.value, 4),
                num(self.stderr, 4),
                num(self.value.exp(), 3)
            ),
            MetricKind::Mean => format!("{} ± {}", num(self.value, 5), num(self.stderr, 5)),
        }
    }

    fn delta_cells(&self) -> [String; 3] {
        let scale = if self.kind == MetricKind::Accuracy {
            100.0
        } else {
            1.0
        };
        let digits = if self.kind == MetricKind::Accuracy {
            2
        } else {
            4
        };
        let z = if self.stderr > 0.0 {
            self.value / self.stderr
        } else {
            f64::NAN
        };
        [
            format!(
                "{}{}",
                if self.value >= 0.0 { "+" } else { "" },
                num(scale * self.value, digits)
            ),
            num(scale * self.stderr, digits),
            num(z, 1),
        ]
    }
}

/// One endpoint's scores.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EndpointScores {
    /// The `/v1` base URL.
    pub url: String,
    /// The model name.
    pub model: String,
    /// How log-likelihood prompts were sent (text + `text_offset`, or token ids).
    pub prompts: String,
    /// One value per metric.
    pub scores: Vec<MetricValue>,
}

/// Everything `fp4forge eval` measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalReport {
    /// Task name.
    pub task: String,
    /// Where the items came from.
    pub source: String,
    /// Items scored.
    pub items: usize,
    /// Items the task has.
    pub total_items: usize,
    /// Seed of the subset (when `items < total_items`).
    pub seed: u64,
    /// Scores per endpoint: the first, and the `--compare` one.
    pub endpoints: Vec<EndpointScores>,
    /// Paired differences second − first, per metric, with σ from the per-item differences.
    pub deltas: Vec<MetricValue>,
    /// Metrics of the pair itself (KL divergence first‖second, top-1 agreement).
    pub paired: Vec<MetricValue>,
    /// Wall time, s.
    pub elapsed_s: f64,
}

impl fmt::Display for EvalReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "task    {}", self.task)?;
        writeln!(f, "data    {}", self.source)?;
        if self.items < self.total_items {
            writeln!(
                f,
                "items   {} of {} (seeded subset, seed {})",
                self.items, self.total_items, self.seed
            )?;
        } else {
            writeln!(f, "items   {} (all)", self.items)?;
        }
        for (i, e) in self.endpoints.iter().enumerate() {
            writeln!(
                f,
                "{}       {} @ {}",
                (b'A' + i as u8) as char,
                e.model,
                e.url
            )?;
        }
        if let Some(e) = self.endpoints.first() {
            if self.task != "wikitext" && self.task != "gsm8k" {
                writeln!(f, "prompts {}", e.prompts)?;
            }
        }
        writeln!(f, "time    {:.1} s", self.elapsed_s)?;
        writeln!(f)?;
        let mut header = vec!["metric".to_string(), "A".to_string()];
        if self.endpoints.len() > 1 {
            header.extend(["B".into(), "B − A".into(), "σ(Δ)".into(), "Δ/σ".into()]);
        }
        let mut t = Table::new(header);
        let Some(first) = self.endpoints.first() else {
            return Ok(());
        };
        for (m, a) in first.scores.iter().enumerate() {
            let unit = match a.kind {
                MetricKind::Accuracy => " (%)",
                MetricKind::Nll => " (nats/token)",
                MetricKind::Mean => "",
            };
            let mut row = vec![format!("{}{unit}", a.metric), a.cell()];
            if let (Some(b), Some(d)) = (
                self.endpoints.get(1).and_then(|e| e.scores.get(m)),
                self.deltas.get(m),
            ) {
                row.push(b.cell());
                row.extend(d.delta_cells());
            }
            t.row(row);
        }
        write!(f, "{t}")?;
        if !self.paired.is_empty() {
            writeln!(f)?;
            let mut t = Table::new(["paired metric", "value"]);
            for p in &self.paired {
                let label = match p.metric.as_str() {
                    "kl" => "mean KL(A‖B) (nats/token, top-N estimate)".to_string(),
                    "top1_agreement" => "top-1 agreement (%)".to_string(),
                    other => other.to_string(),
                };
                t.row([label, p.cell()]);
            }
            write!(f, "{t}")?;
        }
        Ok(())
    }
}
