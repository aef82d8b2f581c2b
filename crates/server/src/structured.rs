//! Structured output with llguidance (the grammar engine vLLM and llama.cpp use): the
//! checkpoint's `tokenizer.json` made into a token trie once ([`Grammars`]), a request's
//! [`OutputConstraint`] compiled into a [`Grammar`] before generation (a schema, regex or
//! grammar that does not compile is a 400 naming its field), and per sequence a matcher behind
//! the engine's [`Constraint`] hook.
//!
//! Each step the scheduler asks the sequence's constraint for its mask, samples, and commits
//! the token; the commit starts the next mask on a grammar thread, so it is computed while the
//! engine runs the next forward pass, and the step only waits for what is not done yet.
//!
//! JSON is written compactly with `", "` and `": "` separators and no other white space
//! (llguidance's `whitespace_flexible: false`), so a sampler cannot wander off into endless
//! white space; a schema's own `x-guidance` options win.

use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::{Arc, Mutex, OnceLock};

use fp4forge_api::{Constrained, OutputConstraint};
use fp4forge_engine::Constraint;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::SimpleVob;
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};

use crate::api_error::ApiError;
use crate::generation::ChoiceSpec;
use crate::state::AppState;

/// The grammar engine of one tokenizer (`Err`: why this checkpoint's tokenizer cannot be used;
/// constrained requests are refused with it).
pub(crate) struct Grammars {
    factory: Result<Arc<ParserFactory>, String>,
}

impl Grammars {
    /// The engine of `tokenizer_json` (the file's bytes) for a model of `vocab` ids (the
    /// tokenizer's own, padded), whose end-of-sequence ids are `eos_ids`.
    pub fn new(tokenizer_json: &[u8], eos_ids: &[u32], vocab: usize) -> Self {
        let factory = (|| {
            let mut tok = toktrie_hf_tokenizers::ByteTokenizer::from_json_bytes(tokenizer_json)
                .map_err(|e| e.to_string())?;
            if !eos_ids.is_empty() {
                tok.set_eos_tokens(eos_ids);
            }
            let env = tok.into_tok_env(Some(vocab)).map_err(|e| e.to_string())?;
            let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
            factory.quiet();
            Ok::<_, String>(Arc::new(factory))
        })()
        .map_err(|e| format!("this model's tokenizer cannot drive the grammar engine: {e}"));
        Self { factory }
    }

    /// An engine that refuses every constraint, saying `why`.
    pub fn unavailable(why: String) -> Self {
        Self {
            factory: Err(format!("structured output is unavailable: {why}")),
        }
    }

    /// Compiles `c` (the field that asked for it named by any error).
    pub fn compile(&self, c: &Constrained) -> Result<Arc<Grammar>, ApiError> {
        let field = c.field.as_str();
        let factory = self
            .factory
            .as_ref()
            .map_err(|e| ApiError::field(field, format!("`{field}`: {e}")))?;
        let grammar = top_level(&c.constraint).map_err(|e| ApiError::field(field, e))?;
        let parser = factory.create_parser(grammar);
        let matcher = Matcher::new(parser);
        if let Some(e) = matcher.get_error() {
            let what = match c.constraint {
                OutputConstraint::JsonSchema(_) | OutputConstraint::JsonObject => "JSON schema",
                OutputConstraint::Regex(_) => "regex",
                OutputConstraint::Choice(_) => "choice list",
                OutputConstraint::Grammar(_) => "grammar",
            };
            return Err(ApiError::field(
                field,
                format!("`{field}`: the {what} does not compile: {e}"),
            ));
        }
        Ok(Arc::new(Grammar {
            prototype: matcher,
            eos_ids: factory.tok_env().tok_trie().eos_tokens().to_vec(),
        }))
    }
}

/// Compiles `c` (on a blocking thread: a large schema takes a while) and gives every choice of
/// `specs` the grammar; nothing when `c` is `None`.
pub(crate) async fn constrain(
    state: &Arc<AppState>,
    c: Option<Constrained>,
    specs: &mut [ChoiceSpec],
) -> Result<(), ApiError> {
    let Some(c) = c else { return Ok(()) };
    let grammars = state.grammars.clone();
    let grammar = tokio::task::spawn_blocking(move || grammars.compile(&c))
        .await
        .map_err(|e| ApiError::internal(format!("grammar task: {e}")))??;
    for spec in specs {
        spec.req.grammar = Some(grammar.clone());
    }
    Ok(())
}

/// The llguidance grammar of a constraint.
fn top_level(c: &OutputConstraint) -> Result<TopLevelGrammar, String> {
    Ok(match c {
        OutputConstraint::JsonSchema(schema) => TopLevelGrammar::from_json_schema(compact(schema)?),
        OutputConstraint::JsonObject => {
            TopLevelGrammar::from_json_schema(compact(&json!({"type": "object"}))?)
        }
        OutputConstraint::Regex(rx) => TopLevelGrammar::from_regex(rx),
        OutputConstraint::Choice(choices) => {
            let alternatives: Vec<String> = choices
                .iter()
                .map(|c| serde_json::to_string(c).unwrap_or_default())
                .collect();
            TopLevelGrammar::from_lark(format!("start: {}", alternatives.join(" | ")))
        }
        OutputConstraint::Grammar(g) => TopLevelGrammar::from_lark(g.clone()),
    })
}

/// `schema` with the compact JSON layout (unless it sets its own `x-guidance`).
fn compact(schema: &Value) -> Result<Value, String> {
    let mut schema = match schema {
        Value::Bool(true) => json!({}),
        Value::Bool(false) => return Err("the schema `false` accepts nothing".into()),
        other => other.clone(),
    };
    if let Value::Object(o) = &mut schema {
        o.entry("x-guidance").or_insert_with(
            || json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    }
    Ok(schema)
}

/// A compiled constraint, shared by a request's sequences; each gets its own matcher.
pub(crate) struct Grammar {
    prototype: Matcher,
    /// The ids the grammar engine calls end-of-sequence (allowed as such only where the text
    /// is complete).
    eos_ids: Vec<u32>,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar").finish_non_exhaustive()
    }
}

impl Grammar {
    /// A fresh constraint for one sequence whose stop tokens are `stop_ids`; its first mask
    /// starts computing now (while the prompt is prefilled).
    pub fn start(&self, stop_ids: &[u32]) -> Box<dyn Constraint> {
        let mut c = GrammarConstraint {
            matcher: Arc::new(Mutex::new(self.prototype.deep_clone())),
            pending: None,
            stop_ids: stop_ids.to_vec(),
            eos_ids: self.eos_ids.clone(),
        };
        c.prefetch();
        Box::new(c)
    }
}

/// One sequence's matcher and its next mask, perhaps still being computed.
struct GrammarConstraint {
    matcher: Arc<Mutex<Matcher>>,
    pending: Option<Receiver<Result<SimpleVob, String>>>,
    stop_ids: Vec<u32>,
    eos_ids: Vec<u32>,
}

/// The threads that compute masks beside the engine (`None`: none could be started; masks
/// are computed in the step then).
fn pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .thread_name(|i| format!("fp4forge-grammar-{i}"))
            .build()
            .ok()
    })
    .as_ref()
}

/// The mask of `matcher`'s state (only end-of-sequence once the grammar is complete).
fn compute(matcher: &Mutex<Matcher>) -> Result<SimpleVob, String> {
    let mut m = matcher
        .lock()
        .map_err(|_| "the grammar matcher failed earlier".to_string())?;
    m.compute_mask_or_eos().map_err(|e| e.to_string())
}

impl GrammarConstraint {
    /// Starts computing the next mask on a grammar thread.
    fn prefetch(&mut self) {
        let Some(pool) = pool() else { return };
        let matcher = self.matcher.clone();
        let (tx, rx) = sync_channel(1);
        pool.spawn(move || {
            let _ = tx.send(compute(&matcher));
        });
        self.pending = Some(rx);
    }
}

impl Constraint for GrammarConstraint {
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        let vob = match self.pending.take().and_then(|rx| rx.recv().ok()) {
            Some(v) => v?,
            None => compute(&self.matcher)?,
        };
        let stops: Vec<(usize, f32)> = self
            .stop_ids
            .iter()
            .filter_map(|&t| logits.get(t as usize).map(|&l| (t as usize, l)))
            .collect();
        apply(&vob, logits);
        for &t in &self.eos_ids {
            if let Some(l) = logits.get_mut(t as usize) {
                *l = f32::NEG_INFINITY;
            }
        }
        // A stop token ends the text: allowed exactly where the grammar may end.
        let complete = self.eos_ids.iter().any(|&t| vob.is_allowed(t));
        for (t, l) in stops {
            logits[t] = if complete { l } else { f32::NEG_INFINITY };
        }
        Ok(())
    }

    fn commit(&mut self, token: u32) -> Result<(), String> {
        if self.stop_ids.contains(&token) {
            return Ok(());
        }
        {
            let mut m = self
                .matcher
                .lock()
                .map_err(|_| "the grammar matcher failed earlier".to_string())?;
            m.consume_token(token)
                .map_err(|e| format!("the grammar refused token {token}: {e}"))?;
        }
        self.prefetch();
        Ok(())
    }
}

/// Sets the logits of the tokens `vob` does not allow (and of ids beyond it) to `-inf`.
fn apply(vob: &SimpleVob, logits: &mut [f32]) {
    let n = vob.len().min(logits.len());
    for (i, l) in logits[..n].iter_mut().enumerate() {
        if !vob.is_allowed(i as u32) {
            *l = f32::NEG_INFINITY;
        }
    }
    for l in &mut logits[n..] {
        *l = f32::NEG_INFINITY;
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use fp4forge_engine::{Sampler, SamplingParams};

    /// A byte-level BPE `tokenizer.json`: the 256 bytes (GPT-2's printable map), a few merges,
    /// and `<|end|>` (id 0) as a special token; 300 ids in all.
    pub(crate) fn small_tokenizer() -> Vec<u8> {
        let mut printable: Vec<u32> = (33..=126).chain(161..=172).chain(174..=255).collect();
        let mut chars = vec!['\0'; 256];
        for &b in &printable {
            chars[b as usize] = char::from_u32(b).expect("char");
        }
        let mut n = 0;
        for b in 0..256u32 {
            if !printable.contains(&b) {
                chars[b as usize] = char::from_u32(256 + n).expect("char");
                printable.push(b);
                n += 1;
            }
        }
        let mut vocab = serde_json::Map::new();
        vocab.insert("<|end|>".into(), json!(0));
        for (i, c) in chars.iter().enumerate() {
            vocab.insert(c.to_string(), json!(i + 1));
        }
        let merges = [
            ("\"", ":"),
            ("t", "r"),
            ("tr", "u"),
            ("tru", "e"),
            ("{", "\""),
        ];
        for (i, (a, b)) in merges.iter().enumerate() {
            vocab.insert(format!("{a}{b}"), json!(257 + i));
        }
        let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false,
                                "trim_offsets": true, "use_regex": true});
        serde_json::to_vec(&json!({
            "version": "1.0", "truncation": null, "padding": null,
            "added_tokens": [{"id": 0, "content": "<|end|>", "single_word": false,
                "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
            "normalizer": null, "pre_tokenizer": byte_level, "post_processor": null,
            "decoder": byte_level,
            "model": {"type": "BPE", "dropout": null, "unk_token": null,
                "continuing_subword_prefix": null, "end_of_word_suffix": null,
                "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                "vocab": vocab,
                "merges": merges.iter().map(|(a, b)| json!([a, b])).collect::<Vec<_>>()}
        }))
        .expect("json")
    }

    const VOCAB: usize = 300;

    fn grammars() -> Grammars {
        Grammars::new(&small_tokenizer(), &[0], VOCAB)
    }

    fn constrained(field: &str, c: OutputConstraint) -> Constrained {
        Constrained {
            field: field.into(),
            constraint: c,
        }
    }

    /// The byte of single-byte token `id` (ids 1..=256 are the bytes in GPT-2's order).
    fn text_of(ids: &[u32]) -> String {
        let tok = tokenizers_bytes();
        let bytes: Vec<u8> = ids.iter().flat_map(|&i| tok[i as usize].clone()).collect();
        String::from_utf8(bytes).expect("utf-8")
    }

    fn tokenizers_bytes() -> Vec<Vec<u8>> {
        toktrie_hf_tokenizers::ByteTokenizer::from_json_bytes(&small_tokenizer())
            .expect("tokenizer")
            .token_bytes()
    }

    /// Samples to the end under `c` from uniform logits (every allowed token equally likely).
    fn run(g: &Grammar, seed: u64, max: usize) -> (String, bool) {
        let mut c = g.start(&[0]);
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed,
        });
        let mut out = Vec::new();
        for _ in 0..max {
            let mut logits = vec![0.0f32; VOCAB];
            match s.sample_constrained(&mut logits, c.as_mut()).expect("mask") {
                Some(0) | None => return (text_of(&out), true),
                Some(t) => out.push(t),
            }
        }
        (text_of(&out), false)
    }

    #[test]
    fn a_schema_constrains_random_sampling_to_valid_json() {
        let schema = json!({"type": "object", "properties": {
            "ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 99},
            "tag": {"enum": ["a", "b"]}}, "required": ["ok", "n", "tag"],
            "additionalProperties": false});
        let g = grammars()
            .compile(&constrained(
                "response_format",
                OutputConstraint::JsonSchema(schema.clone()),
            ))
            .expect("compiles");
        for seed in 0..5 {
            let (text, ended) = run(&g, seed, 200);
            assert!(ended, "{text}");
            let v: Value = serde_json::from_str(&text).expect(&text);
            assert!(
                v["ok"].is_boolean() && v["n"].as_u64().is_some_and(|n| n <= 99),
                "{v}"
            );
            assert!(["a", "b"].contains(&v["tag"].as_str().unwrap_or("")), "{v}");
            assert!(text.starts_with("{\"ok\": "), "compact layout: {text}");
        }
    }

    #[test]
    fn regex_choice_and_lark_grammar_constrain() {
        let gs = grammars();
        let g = gs
            .compile(&constrained(
                "guided_regex",
                OutputConstraint::Regex("[0-9]{3}-[a-c]{2}".into()),
            ))
            .expect("regex");
        let (text, ended) = run(&g, 1, 50);
        assert!(
            ended && text.len() == 6 && text.as_bytes()[3] == b'-',
            "{text}"
        );
        let g = gs
            .compile(&constrained(
                "guided_choice",
                OutputConstraint::Choice(vec!["yes \"sir\"".into(), "no".into()]),
            ))
            .expect("choice");
        for seed in 0..4 {
            let (text, _) = run(&g, seed, 50);
            assert!(text == "yes \"sir\"" || text == "no", "{text}");
        }
        let g = gs
            .compile(&constrained(
                "guided_grammar",
                OutputConstraint::Grammar(
                    "start: \"(\" NUM (\"+\" NUM)? \")\"\nNUM: /[1-9]/".into(),
                ),
            ))
            .expect("lark");
        let (text, _) = run(&g, 2, 50);
        assert!(text.starts_with('(') && text.ends_with(')'), "{text}");
    }

    #[test]
    fn stop_tokens_wait_for_a_complete_text() {
        let g = grammars()
            .compile(&constrained(
                "guided_regex",
                OutputConstraint::Regex("ab".into()),
            ))
            .expect("regex");
        let mut c = g.start(&[0]);
        // the stop token (id 0) is the likeliest, but "ab" is not written yet
        let mut logits = vec![0.0f32; VOCAB];
        logits[0] = 50.0;
        c.mask(&mut logits).expect("mask");
        assert_eq!(logits[0], f32::NEG_INFINITY);
        let allowed: Vec<usize> = (0..VOCAB).filter(|&i| logits[i].is_finite()).collect();
        assert_eq!(text_of(&[allowed[0] as u32]), "a", "{allowed:?}");
        c.commit(allowed[0] as u32).expect("a");
        let b = tokenizers_bytes()
            .iter()
            .position(|t| t == b"b")
            .expect("b") as u32;
        c.commit(b).expect("b");
        let mut logits = vec![0.0f32; VOCAB];
        c.mask(&mut logits).expect("mask");
        assert!(logits[0].is_finite());
        assert_eq!(logits.iter().filter(|l| l.is_finite()).count(), 1);
    }

    #[test]
    fn bad_constraints_are_refused_by_field() {
        let gs = grammars();
        for (field, c, word) in [
            (
                "guided_regex",
                OutputConstraint::Regex("a(".into()),
                "regex",
            ),
            (
                "structured_outputs.grammar",
                OutputConstraint::Grammar("start: nothing_defined".into()),
                "grammar",
            ),
            (
                "response_format",
                OutputConstraint::JsonSchema(json!({"type": "object", "minProperties": 3,
                    "maxProperties": 1})),
                "JSON schema",
            ),
            (
                "guided_json",
                OutputConstraint::JsonSchema(json!({"type": "nonsense"})),
                "JSON schema",
            ),
        ] {
            let e = gs.compile(&constrained(field, c)).expect_err(field);
            assert_eq!(e.param.as_deref(), Some(field));
            assert!(e.message.contains(word), "{}", e.message);
        }
    }
}
