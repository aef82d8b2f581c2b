//! compressed-tensors `targets` / `ignore` matching, as `quantization_config` and `--targets` /
//! `--ignore` spell it.
//!
//! A pattern is either
//! - `re:REGEX`: Python `re.match(REGEX, module_name)`, anchored at the **start only** (so
//!   `re:.*q_proj` also matches `model.layers.0.self_attn.q_proj_extra`; write `$` for a full
//!   match). Compiled here as `^(?:REGEX)` with the `regex` crate, which lacks look-around and
//!   back-references: such patterns are refused, not misread.
//! - anything else: an exact module name, or a class name. A checkpoint carries no classes, so the
//!   only class name understood is [`LINEAR_CLASS`] (`Linear`), which matches every module the
//!   caller says is linear (see [`is_linear_weight`]).
//!
//! `ignore` uses the same rules and wins over `targets`.

use std::fmt;

use regex::Regex;

use crate::BuilderError;

/// The one class name a plain pattern can mean: every linear layer.
pub const LINEAR_CLASS: &str = "Linear";

/// One `targets` or `ignore` entry.
#[derive(Debug, Clone)]
pub enum ModulePattern {
    /// `re:REGEX`, matched at the start of the module name.
    Regex {
        /// The text after `re:`, as written.
        source: String,
        /// `^(?:source)`, compiled.
        regex: Regex,
    },
    /// An exact module name, or the class name `Linear`.
    Name(String),
}

impl ModulePattern {
    /// Parses one entry; fails only on a `re:` regex that does not compile.
    pub fn parse(pattern: &str) -> Result<Self, BuilderError> {
        match pattern.strip_prefix("re:") {
            Some(source) => {
                let regex = Regex::new(&format!("^(?:{source})")).map_err(|e| {
                    BuilderError::InvalidPattern {
                        pattern: pattern.to_string(),
                        source: Box::new(e),
                    }
                })?;
                Ok(Self::Regex {
                    source: source.to_string(),
                    regex,
                })
            }
            None => Ok(Self::Name(pattern.to_string())),
        }
    }

    /// Whether `module` (a module name such as `model.layers.3.self_attn.q_proj`) matches;
    /// `is_linear` says whether that module is a linear layer (for the class name `Linear`).
    pub fn matches(&self, module: &str, is_linear: bool) -> bool {
        self.matches_name(module) || (is_linear && self.is_linear_class())
    }

    /// Whether `module` matches by name alone (regex or exact name), ignoring class names.
    pub fn matches_name(&self, module: &str) -> bool {
        match self {
            Self::Regex { regex, .. } => regex.is_match(module),
            Self::Name(name) => name == module,
        }
    }

    /// Whether this is the class name `Linear`.
    pub fn is_linear_class(&self) -> bool {
        matches!(self, Self::Name(name) if name == LINEAR_CLASS)
    }
}

impl fmt::Display for ModulePattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Regex { source, .. } => write!(f, "re:{source}"),
            Self::Name(name) => f.write_str(name),
        }
    }
}

/// A `targets` list with its `ignore` list: one compressed-tensors scheme's selection.
#[derive(Debug, Clone, Default)]
pub struct TargetMatcher {
    targets: Vec<ModulePattern>,
    ignore: Vec<ModulePattern>,
}

impl TargetMatcher {
    /// Parses both lists; fails on the first pattern that does not compile.
    pub fn new<T, I>(targets: T, ignore: I) -> Result<Self, BuilderError>
    where
        T: IntoIterator,
        T::Item: AsRef<str>,
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let parse = |p: &str| ModulePattern::parse(p);
        Ok(Self {
            targets: targets
                .into_iter()
                .map(|p| parse(p.as_ref()))
                .collect::<Result<_, _>>()?,
            ignore: ignore
                .into_iter()
                .map(|p| parse(p.as_ref()))
                .collect::<Result<_, _>>()?,
        })
    }

    /// Whether `module` is selected: some target matches and no ignore entry does.
    pub fn matches(&self, module: &str, is_linear: bool) -> bool {
        self.targets.iter().any(|p| p.matches(module, is_linear))
            && !self.is_ignored(module, is_linear)
    }

    /// Like [`matches`](Self::matches), but only name and regex targets count (no class names).
    /// vLLM resolves a name hit in one scheme before a class hit in another; this is that first pass.
    pub fn matches_by_name(&self, module: &str, is_linear: bool) -> bool {
        self.targets.iter().any(|p| p.matches_name(module)) && !self.is_ignored(module, is_linear)
    }

    /// Whether an `ignore` entry matches `module`.
    pub fn is_ignored(&self, module: &str, is_linear: bool) -> bool {
        self.ignore.iter().any(|p| p.matches(module, is_linear))
    }

    /// The parsed `targets`.
    pub fn targets(&self) -> &[ModulePattern] {
        &self.targets
    }

    /// The parsed `ignore` entries.
    pub fn ignore(&self) -> &[ModulePattern] {
        &self.ignore
    }
}

/// Whether a module name is an input embedding (`embed_tokens` and its spellings), which is
/// never `Linear`.
pub fn is_embedding_module(module: &str) -> bool {
    let last = module.rsplit('.').next().unwrap_or(module);
    matches!(
        last,
        "embed_tokens" | "wte" | "tok_embeddings" | "word_embeddings" | "embeddings" | "embed"
    )
}

/// Whether a tensor is the weight of a linear layer: a 2-D `.weight` outside the input
/// embedding. `lm_head` and MoE routers are linear, exactly as in transformers.
pub fn is_linear_weight(tensor: &str, shape: &[u64]) -> bool {
    match tensor.strip_suffix(".weight") {
        Some(module) => shape.len() == 2 && !is_embedding_module(module),
        None => false,
    }
}

/// The `n` module names nearest to what `pattern` spells (edit distance between the pattern's
/// literal text and as many trailing name components), one per name shape (layer and expert
/// numbers aside), for error messages.
pub fn nearest_modules(pattern: &ModulePattern, modules: &[&str], n: usize) -> Vec<String> {
    let text: String = match pattern {
        ModulePattern::Regex { source, .. } => source
            .replace("\\.", ".")
            .chars()
            .filter(|c| !"\\^$()[]{}?+*|".contains(*c))
            .collect::<String>()
            .trim_matches('.')
            .to_string(),
        ModulePattern::Name(name) => name.clone(),
    };
    let parts = text.split('.').count();
    let shape = |name: &str| -> String {
        name.split('.')
            .map(|c| {
                if c.bytes().all(|b| b.is_ascii_digit()) {
                    "N"
                } else {
                    c
                }
            })
            .collect::<Vec<_>>()
            .join(".")
    };
    let mut seen = std::collections::HashSet::new();
    let mut scored: Vec<(usize, &str)> = Vec::new();
    for &m in modules {
        if !seen.insert(shape(m)) {
            continue;
        }
        let comps: Vec<&str> = m.split('.').collect();
        let tail = comps[comps.len().saturating_sub(parts)..].join(".");
        scored.push((edit_distance(&text, &tail), m));
    }
    scored.sort_by_key(|&(d, _)| d);
    scored
        .into_iter()
        .take(n)
        .map(|(_, m)| m.to_string())
        .collect()
}

/// Levenshtein distance between two strings, by characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (diag + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diag = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regex_is_anchored_at_start_only() {
        let p = ModulePattern::parse(r"re:.*self_attn\.q_proj").unwrap();
        assert!(p.matches("model.layers.0.self_attn.q_proj", true));
        // re.match does not anchor the end.
        assert!(p.matches("model.layers.0.self_attn.q_proj_x", true));
        let p = ModulePattern::parse(r"re:self_attn\.q_proj$").unwrap();
        // ...but does anchor the start: no search semantics.
        assert!(!p.matches("model.layers.0.self_attn.q_proj", true));
        assert!(p.matches("self_attn.q_proj", false));
    }

    #[test]
    fn alternation_is_grouped_under_the_anchor() {
        let p = ModulePattern::parse(r"re:model\.norm|.*lm_head$").unwrap();
        assert!(p.matches("lm_head", true));
        assert!(p.matches("model.norm", false));
        assert!(!p.matches("x.model.norm", false));
    }

    #[test]
    fn plain_names_are_exact_or_linear_class() {
        let p = ModulePattern::parse("lm_head").unwrap();
        assert!(p.matches("lm_head", true));
        assert!(!p.matches("model.lm_head", true));
        let linear = ModulePattern::parse("Linear").unwrap();
        assert!(linear.matches("model.layers.1.mlp.gate", true));
        assert!(!linear.matches("model.embed_tokens", false));
        assert!(!linear.matches_name("model.layers.1.mlp.gate"));
    }

    #[test]
    fn ignore_wins() {
        let m = TargetMatcher::new(["Linear"], ["lm_head", r"re:.*mlp\.gate$"]).unwrap();
        assert!(m.matches("model.layers.1.mlp.experts.0.up_proj", true));
        assert!(m.matches("model.layers.1.mlp.gate_proj", true));
        assert!(!m.matches("model.layers.1.mlp.gate", true));
        assert!(!m.matches("lm_head", true));
        assert!(!m.matches("model.layers.1.input_layernorm", false));
        assert!(!m.matches_by_name("model.layers.1.mlp.gate_proj", true));
    }

    #[test]
    fn nearest_names_follow_the_pattern() {
        let modules = [
            "model.layers.0.self_attn.q_proj",
            "model.layers.0.self_attn.o_proj",
            "model.layers.0.mlp.experts.0.down_proj",
            "model.layers.1.self_attn.q_proj",
            "lm_head",
        ];
        let p = ModulePattern::parse(r"re:.*self_attn\.q_prj$").unwrap();
        let near = nearest_modules(&p, &modules, 2);
        assert_eq!(near[0], "model.layers.0.self_attn.q_proj");
        assert_eq!(near.len(), 2);
        assert!(!near.contains(&"model.layers.1.self_attn.q_proj".to_string()));
        let p = ModulePattern::parse("lm_haed").unwrap();
        assert_eq!(nearest_modules(&p, &modules, 1), ["lm_head"]);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }

    #[test]
    fn bad_regex_is_an_error() {
        let err = ModulePattern::parse(r"re:(?<=x)y").unwrap_err();
        assert!(err.to_string().contains("re:(?<=x)y"));
    }

    #[test]
    fn linear_weights() {
        assert!(is_linear_weight("lm_head.weight", &[10, 4]));
        assert!(is_linear_weight(
            "model.layers.1.mlp.gate.weight",
            &[256, 3072]
        ));
        assert!(!is_linear_weight("model.embed_tokens.weight", &[10, 4]));
        assert!(!is_linear_weight("model.norm.weight", &[4]));
        assert!(!is_linear_weight("x.weight_packed", &[4, 2]));
    }
}
