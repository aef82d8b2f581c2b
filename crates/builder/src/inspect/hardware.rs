//! Memory-bandwidth profiles and the decode roofline: tok/s ≤ bandwidth ÷ bytes read per token.

use serde::Serialize;

use super::kv::{KvDtype, KvReport};
use crate::BuilderError;

/// A device by its memory bandwidth.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HardwareProfile {
    /// Display name.
    pub name: String,
    /// Memory bandwidth in GB/s (10^9 bytes per second).
    pub bandwidth_gbps: f64,
}

/// Built-in profiles: (name, GB/s, extra aliases).
const BUILTINS: &[(&str, f64, &[&str])] = &[
    ("GB10", 273.0, &["dgx-spark", "spark"]),
    ("RTX-Pro-6000", 1790.0, &["rtx6000", "rtx-pro"]),
    ("H200", 4800.0, &[]),
    ("B200", 8000.0, &[]),
];

fn normalize(name: &str) -> String {
    name.chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

impl HardwareProfile {
    /// A profile.
    pub fn new(name: impl Into<String>, bandwidth_gbps: f64) -> Self {
        Self {
            name: name.into(),
            bandwidth_gbps,
        }
    }

    /// GB10 (DGX Spark) 273 GB/s, RTX Pro 6000 1790, H200 4800, B200 8000.
    pub fn builtins() -> Vec<Self> {
        BUILTINS.iter().map(|(n, b, _)| Self::new(*n, *b)).collect()
    }

    /// A built-in by name, ignoring case and punctuation (`gb10`, `rtx-pro-6000`, `h200`).
    pub fn builtin(name: &str) -> Option<Self> {
        let want = normalize(name);
        BUILTINS
            .iter()
            .find(|(n, _, aliases)| {
                normalize(n) == want || aliases.iter().any(|a| normalize(a) == want)
            })
            .map(|(n, b, _)| Self::new(*n, *b))
    }

    /// Parses `NAME` (a built-in) or `NAME=GBPS` (any device).
    pub fn parse(spec: &str) -> Result<Self, BuilderError> {
        let err = |reason: String| BuilderError::Hardware {
            spec: spec.to_string(),
            reason,
        };
        match spec.split_once('=') {
            Some((name, gbps)) => {
                let bw: f64 = gbps
                    .trim()
                    .trim_end_matches("GB/s")
                    .trim()
                    .parse()
                    .map_err(|_| err(format!("{gbps:?} is not a number of GB/s")))?;
                if !(bw.is_finite() && bw > 0.0) || name.trim().is_empty() {
                    return Err(err("want NAME=GBPS with a positive bandwidth".into()));
                }
                Ok(Self::new(name.trim(), bw))
            }
            None => Self::builtin(spec).ok_or_else(|| {
                let known: Vec<&str> = BUILTINS.iter().map(|(n, _, _)| *n).collect();
                err(format!(
                    "unknown device (known: {}; or give NAME=GBPS)",
                    known.join(", ")
                ))
            }),
        }
    }

    /// Decode tokens per second at batch 1 if every byte is read once per token at full bandwidth.
    pub fn ceiling(&self, bytes_per_token: f64) -> f64 {
        self.bandwidth_gbps * 1e9 / bytes_per_token
    }
}

/// The roofline at one context length.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CeilingAt {
    /// Tokens in context; 0 means weights only (KV excluded).
    pub context: u64,
    /// Weights plus KV read per token.
    pub bytes_per_token: f64,
    /// bandwidth ÷ bytes_per_token.
    pub tok_s: f64,
}

/// One device's decode ceilings.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RooflineRow {
    /// The device.
    pub hardware: HardwareProfile,
    /// KV dtype used for the context columns.
    pub kv_dtype: KvDtype,
    /// Weights-only first, then each context of the KV report.
    pub ceilings: Vec<CeilingAt>,
}

/// Ceilings for each device: weights only, then at each context of `kv` with its dtype.
pub fn roofline(
    hardware: &[HardwareProfile],
    weight_bytes_per_token: f64,
    kv: &KvReport,
) -> Vec<RooflineRow> {
    hardware
        .iter()
        .map(|hw| {
            let at = |context: u64, bytes: f64| CeilingAt {
                context,
                bytes_per_token: bytes,
                tok_s: hw.ceiling(bytes),
            };
            let mut ceilings = vec![at(0, weight_bytes_per_token)];
            ceilings.extend(
                kv.contexts
                    .iter()
                    .map(|c| at(c.context, weight_bytes_per_token + c.bytes(kv.dtype) as f64)),
            );
            RooflineRow {
                hardware: hw.clone(),
                kv_dtype: kv.dtype,
                ceilings,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_profiles() {
        assert_eq!(
            HardwareProfile::parse("gb10").unwrap().bandwidth_gbps,
            273.0
        );
        assert_eq!(
            HardwareProfile::parse("rtx pro 6000").unwrap().name,
            "RTX-Pro-6000"
        );
        let custom = HardwareProfile::parse("MI300X=5300").unwrap();
        assert_eq!(custom, HardwareProfile::new("MI300X", 5300.0));
        assert!(HardwareProfile::parse("nope").is_err());
        assert!(HardwareProfile::parse("x=-1").is_err());
        assert!(HardwareProfile::parse("x=fast").is_err());
    }
}
