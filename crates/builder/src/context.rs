//! Switching a checkpoint's maximum context: the YaRN settings of the full-attention layers and
//! `max_position_embeddings` in its `config.json`.
//!
//! Laguna-S-2.1 shipped in two revisions that differ only here (laguna.md §1.1): 256k context
//! (YaRN factor 32, `attention_factor` 0.1·ln 32 + 1) and 1M (factor 128, 0.1·ln 128 + 1). The
//! switch edits the file as text: only the three values change, every other byte (key order,
//! number spellings, whitespace) stays as it was. The YaRN block is
//! `rope_parameters.full_attention` in current configs; a flat `rope_parameters` or a legacy
//! `rope_scaling` (flat or per layer type) with `rope_type` (or `type`) `"yarn"` is handled too,
//! and every such block found is updated. A config without one is refused.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use fp4forge_format::write_file_atomic;
use serde::Serialize;
use serde_json::Value;

use crate::BuilderError;

/// A supported maximum context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum MaxContext {
    /// 262 144 tokens: YaRN factor 32, `attention_factor` 1.3465735902799727.
    #[serde(rename = "256k")]
    K256,
    /// 1 048 576 tokens: YaRN factor 128, `attention_factor` 1.4852030263919618.
    #[serde(rename = "1m")]
    M1,
}

impl MaxContext {
    /// YaRN `factor`.
    pub fn factor(self) -> f64 {
        match self {
            MaxContext::K256 => 32.0,
            MaxContext::M1 => 128.0,
        }
    }

    /// YaRN `attention_factor` (0.1·ln factor + 1, as shipped).
    pub fn attention_factor(self) -> f64 {
        match self {
            MaxContext::K256 => 1.346_573_590_279_972_7,
            MaxContext::M1 => 1.485_203_026_391_961_8,
        }
    }

    /// `max_position_embeddings`.
    pub fn max_position_embeddings(self) -> u64 {
        match self {
            MaxContext::K256 => 262_144,
            MaxContext::M1 => 1_048_576,
        }
    }

    /// The name on the command line: `256k` or `1m`.
    pub fn name(self) -> &'static str {
        match self {
            MaxContext::K256 => "256k",
            MaxContext::M1 => "1m",
        }
    }
}

impl fmt::Display for MaxContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for MaxContext {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "256k" | "262144" => Ok(MaxContext::K256),
            "1m" | "1048576" => Ok(MaxContext::M1),
            _ => Err(format!("unknown max context {s:?} (expected 256k or 1m)")),
        }
    }
}

/// What [`set_max_context`] found and did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ContextReport {
    /// The `config.json` concerned.
    pub config: PathBuf,
    /// The context asked for.
    pub max_context: MaxContext,
    /// JSON paths of the YaRN blocks updated (e.g. `rope_parameters.full_attention`).
    pub blocks: Vec<String>,
    /// Whether the file was rewritten (`false`: it already had these settings).
    pub changed: bool,
    /// `max_position_embeddings` before, when it was an integer.
    pub previous_max_position_embeddings: Option<u64>,
    /// The first block's YaRN `factor` before.
    pub previous_factor: Option<f64>,
}

/// Where the YaRN block may live, in order of preference.
const CANDIDATES: [&[&str]; 4] = [
    &["rope_parameters", "full_attention"],
    &["rope_parameters"],
    &["rope_scaling", "full_attention"],
    &["rope_scaling"],
];

fn is_yarn(block: &Value) -> bool {
    let kind = |k: &str| block.get(k).and_then(Value::as_str);
    block.is_object() && (kind("rope_type") == Some("yarn") || kind("type") == Some("yarn"))
}

fn lookup<'a>(root: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(root, |v, k| v.get(*k))
}

fn lookup_mut<'a>(root: &'a mut Value, path: &[&str]) -> Option<&'a mut Value> {
    path.iter().try_fold(root, |v, k| v.get_mut(*k))
}

/// Sets the maximum context of the checkpoint whose `config.json` is `path` (or lies in the
/// directory `path`), in place and atomically. Idempotent: when the config already has the
/// settings, nothing is written and the report says `changed: false`.
pub fn set_max_context(path: &Path, max: MaxContext) -> Result<ContextReport, BuilderError> {
    let config = if path.is_dir() {
        path.join("config.json")
    } else {
        path.to_path_buf()
    };
    let text = std::fs::read_to_string(&config).map_err(|source| BuilderError::Io {
        path: config.clone(),
        source,
    })?;
    let root: Value = serde_json::from_str(&text).map_err(|source| BuilderError::Json {
        path: config.clone(),
        source,
    })?;
    let config_err = |field: &str, reason: String| BuilderError::Config {
        source_name: config.display().to_string(),
        field: field.to_owned(),
        reason,
    };
    if !root.is_object() {
        return Err(config_err("", "not a JSON object".into()));
    }
    let blocks: Vec<&[&str]> = CANDIDATES
        .into_iter()
        .filter(|p| lookup(&root, p).is_some_and(is_yarn))
        .collect();
    if blocks.is_empty() {
        return Err(config_err(
            "rope_parameters",
            "no YaRN rope block (rope_parameters.full_attention, rope_parameters or \
             rope_scaling with rope_type \"yarn\"): refusing to set a context length"
                .into(),
        ));
    }

    let previous_max_position_embeddings =
        root.get("max_position_embeddings").and_then(Value::as_u64);
    let previous_factor = lookup(&root, blocks[0])
        .and_then(|b| b.get("factor"))
        .and_then(Value::as_f64);

    // Each wanted (path, value) that the file does not already have.
    let number = |x: f64| serde_json::Number::from_f64(x).map(Value::Number);
    let mut wanted: Vec<(Vec<&str>, Value)> = Vec::new();
    for block in &blocks {
        for (key, value) in [
            ("factor", max.factor()),
            ("attention_factor", max.attention_factor()),
        ] {
            let mut p = block.to_vec();
            p.push(key);
            wanted.push((p, number(value).unwrap_or(Value::Null)));
        }
    }
    wanted.push((
        vec!["max_position_embeddings"],
        Value::from(max.max_position_embeddings()),
    ));
    let same = |current: Option<&Value>, want: &Value| {
        current
            .and_then(Value::as_f64)
            .zip(want.as_f64())
            .is_some_and(|(a, b)| a == b)
    };
    let changes: Vec<(Vec<&str>, Value)> = wanted
        .into_iter()
        .filter(|(p, v)| !same(lookup(&root, p), v))
        .collect();

    let mut report = ContextReport {
        config: config.clone(),
        max_context: max,
        blocks: blocks.iter().map(|p| p.join(".")).collect(),
        changed: false,
        previous_max_position_embeddings,
        previous_factor,
    };
    if changes.is_empty() {
        return Ok(report);
    }

    let mut edits = Vec::with_capacity(changes.len());
    for (p, v) in &changes {
        let (key, parent) = p.split_last().expect("paths are not empty");
        let rendered = serde_json::to_string(v).unwrap_or_default();
        let edit = json_text::plan_set(&text, parent, key, &rendered)
            .map_err(|reason| config_err(&p.join("."), reason))?;
        edits.push(edit);
    }
    let new_text = json_text::apply(&text, edits);

    // The edited text must parse to exactly the old config with the new values.
    let mut expected = root.clone();
    for (p, v) in &changes {
        let (key, parent) = p.split_last().expect("paths are not empty");
        if let Some(Value::Object(obj)) = lookup_mut(&mut expected, parent) {
            obj.insert((*key).to_owned(), v.clone());
        }
    }
    let reparsed: Value = serde_json::from_str(&new_text).map_err(|source| BuilderError::Json {
        path: config.clone(),
        source,
    })?;
    if reparsed != expected {
        return Err(config_err(
            "",
            "internal error: the edited config does not read back as intended; not written".into(),
        ));
    }
    write_file_atomic(&config, new_text.as_bytes())?;
    report.changed = true;
    Ok(report)
}

/// Minimal, exact JSON text surgery: locate a member's value by path and plan its replacement
/// (or insertion), leaving every other byte alone.
mod json_text {
    use super::Range;

    /// Replace `range` of the text by `text`.
    pub(super) struct Edit {
        range: Range<usize>,
        text: String,
    }

    /// Applies non-overlapping edits.
    pub(super) fn apply(src: &str, mut edits: Vec<Edit>) -> String {
        edits.sort_by_key(|e| std::cmp::Reverse(e.range.start));
        let mut out = src.to_owned();
        for e in edits {
            out.replace_range(e.range, &e.text);
        }
        out
    }

    /// A member of an object: its key (decoded), the span of the key's string token, and the
    /// span of its value.
    struct Member {
        key: String,
        key_span: Range<usize>,
        value: Range<usize>,
    }

    struct Scanner<'a> {
        s: &'a [u8],
        pos: usize,
    }

    impl Scanner<'_> {
        fn ws(&mut self) {
            while self
                .s
                .get(self.pos)
                .is_some_and(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
            {
                self.pos += 1;
            }
        }

        fn expect(&mut self, b: u8) -> Result<(), String> {
            if self.s.get(self.pos) == Some(&b) {
                self.pos += 1;
                Ok(())
            } else {
                Err(format!("expected '{}' at byte {}", b as char, self.pos))
            }
        }

        fn string(&mut self) -> Result<Range<usize>, String> {
            let start = self.pos;
            self.expect(b'"')?;
            while let Some(&b) = self.s.get(self.pos) {
                self.pos += 1;
                match b {
                    b'\\' => self.pos += 1,
                    b'"' => return Ok(start..self.pos),
                    _ => {}
                }
            }
            Err("unterminated string".into())
        }

        /// Skips one value (the scanner is at its first byte), returning its span.
        fn value(&mut self) -> Result<Range<usize>, String> {
            let start = self.pos;
            match self.s.get(self.pos) {
                Some(b'"') => {
                    self.string()?;
                }
                Some(b'{') | Some(b'[') => {
                    let mut depth = 0usize;
                    while let Some(&b) = self.s.get(self.pos) {
                        match b {
                            b'"' => {
                                self.string()?;
                                continue;
                            }
                            b'{' | b'[' => depth += 1,
                            b'}' | b']' => {
                                depth -= 1;
                                if depth == 0 {
                                    self.pos += 1;
                                    return Ok(start..self.pos);
                                }
                            }
                            _ => {}
                        }
                        self.pos += 1;
                    }
                    return Err("unterminated container".into());
                }
                Some(_) => {
                    while self.s.get(self.pos).is_some_and(|b| {
                        !matches!(b, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
                    }) {
                        self.pos += 1;
                    }
                }
                None => return Err("unexpected end of text".into()),
            }
            Ok(start..self.pos)
        }

        /// The members of the object starting at the scanner, which ends past its `}`.
        fn members(&mut self) -> Result<Vec<Member>, String> {
            self.expect(b'{')?;
            let mut out = Vec::new();
            self.ws();
            if self.s.get(self.pos) == Some(&b'}') {
                self.pos += 1;
                return Ok(out);
            }
            loop {
                self.ws();
                let key_span = self.string()?;
                let key: String = serde_json::from_slice(&self.s[key_span.clone()])
                    .map_err(|e| format!("bad key at byte {}: {e}", key_span.start))?;
                self.ws();
                self.expect(b':')?;
                self.ws();
                let value = self.value()?;
                out.push(Member {
                    key,
                    key_span,
                    value,
                });
                self.ws();
                match self.s.get(self.pos) {
                    Some(b',') => self.pos += 1,
                    Some(b'}') => {
                        self.pos += 1;
                        return Ok(out);
                    }
                    _ => return Err(format!("expected ',' or '}}' at byte {}", self.pos)),
                }
            }
        }
    }

    /// Plans setting member `key` of the object at `parent` (a path of keys from the root) to
    /// the JSON text `value`: the member's value is replaced in place, or, when absent, a new
    /// member is appended after the last one with the same separator and indentation.
    pub(super) fn plan_set(
        src: &str,
        parent: &[&str],
        key: &str,
        value: &str,
    ) -> Result<Edit, String> {
        let mut sc = Scanner {
            s: src.as_bytes(),
            pos: 0,
        };
        sc.ws();
        let mut object_start = sc.pos;
        for step in parent {
            sc.pos = object_start;
            let members = sc.members()?;
            let m = members
                .iter()
                .rev() // JSON parsers keep the last duplicate
                .find(|m| m.key == *step)
                .ok_or_else(|| format!("no member {step:?}"))?;
            object_start = m.value.start;
        }
        sc.pos = object_start;
        let members = sc.members()?;
        if let Some(m) = members.iter().rev().find(|m| m.key == key) {
            return Ok(Edit {
                range: m.value.clone(),
                text: value.to_owned(),
            });
        }
        let key_json = serde_json::to_string(key).unwrap_or_default();
        match (members.first(), members.last()) {
            (Some(first), Some(last)) => {
                // Indentation: what precedes the first key since the opening brace.
                let indent = &src[object_start + 1..first.key_span.start];
                let sep = &src[last.key_span.end..last.value.start];
                Ok(Edit {
                    range: last.value.end..last.value.end,
                    text: format!(",{indent}{key_json}{sep}{value}"),
                })
            }
            _ => Ok(Edit {
                range: object_start + 1..object_start + 1,
                text: format!("{key_json}: {value}"),
            }),
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        fn set(src: &str, parent: &[&str], key: &str, value: &str) -> String {
            apply(src, vec![plan_set(src, parent, key, value).unwrap()])
        }

        #[test]
        fn replaces_only_the_value() {
            let src =
                "{\n  \"a\": {\"s\": \"x}\\\"{\", \"f\": 1e-06},\n  \"b\": [1, {\"f\": 2}]\n}\n";
            assert_eq!(
                set(src, &["a"], "f", "3.0"),
                "{\n  \"a\": {\"s\": \"x}\\\"{\", \"f\": 3.0},\n  \"b\": [1, {\"f\": 2}]\n}\n"
            );
            assert_eq!(
                set(src, &[], "b", "7"),
                "{\n  \"a\": {\"s\": \"x}\\\"{\", \"f\": 1e-06},\n  \"b\": 7\n}\n"
            );
        }

        #[test]
        fn appends_a_missing_member_with_the_same_layout() {
            let src = "{\n    \"a\": 1,\n    \"b\": 2\n}";
            assert_eq!(
                set(src, &[], "c", "3"),
                "{\n    \"a\": 1,\n    \"b\": 2,\n    \"c\": 3\n}"
            );
            assert_eq!(set("{}", &[], "c", "3"), "{\"c\": 3}");
        }

        #[test]
        fn missing_parent_is_an_error() {
            assert!(plan_set("{\"a\": 1}", &["x"], "c", "3").is_err());
        }
    }
}
