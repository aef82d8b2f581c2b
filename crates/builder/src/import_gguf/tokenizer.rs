//! `tokenizer.json` and `tokenizer_config.json` rebuilt from a GGUF's embedded tokenizer
//! (`tokenizer.ggml.*`): a byte-level BPE (`model = gpt2`) with the vocabulary and merges as
//! stored, control tokens as special added tokens, and the pre-tokenizer that llama.cpp applies
//! for `tokenizer.ggml.pre`, spelled the way the original HF tokenizer.json spells it.

use std::path::Path;

use fp4forge_format::gguf::GgufHeader;
use serde::Serialize;
use serde_json::{json, Map, Value};

use super::arch::import_error;
use crate::BuilderError;

/// llama.cpp token types (`llama_token_type`).
const NORMAL: i64 = 1;
const UNKNOWN: i64 = 2;
const CONTROL: i64 = 3;
const USER_DEFINED: i64 = 4;

/// Qwen2's split regex (digits one by one).
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Llama 3's split regex (digits in groups of up to three).
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// `tokenizer.ggml.pre` values this importer rebuilds, by pre-tokenizer family.
pub const SUPPORTED_PRE_TOKENIZERS: [&str; 16] = [
    "default",
    "gpt2",
    "mpt",
    "olmo",
    "jais",
    "smollm",
    "starcoder",
    "refact",
    "codeshell",
    "command-r",
    "exaone",
    "minerva",
    "qwen2",
    "deepseek-r1-qwen",
    "llama3",
    "llama-bpe",
];

/// What the rebuilt tokenizer holds.
#[derive(Debug, Clone, Serialize)]
pub struct TokenizerSummary {
    /// `tokenizer.ggml.pre`, i.e. which pre-tokenizer was rebuilt.
    pub pre_tokenizer: String,
    /// Tokens in the vocabulary.
    pub vocab_size: usize,
    /// BPE merges.
    pub merges: usize,
    /// Added tokens (control tokens as special, user-defined ones as not special).
    pub added_tokens: usize,
    /// Token strings that appear more than once (only the first id keeps the string).
    pub duplicate_tokens: usize,
    /// Whether a chat template was found and written.
    pub chat_template: bool,
}

/// The two JSON files and their summary.
pub(crate) struct TokenizerFiles {
    pub tokenizer: Value,
    pub config: Value,
    pub summary: TokenizerSummary,
}

fn byte_level(add_prefix_space: bool, trim_offsets: bool, use_regex: bool) -> Value {
    json!({
        "type": "ByteLevel",
        "add_prefix_space": add_prefix_space,
        "trim_offsets": trim_offsets,
        "use_regex": use_regex,
    })
}

fn split(regex: &str) -> Value {
    json!({ "type": "Split", "pattern": { "Regex": regex }, "behavior": "Isolated", "invert": false })
}

/// (normalizer, pre_tokenizer, post-processor base, decoder) for `pre`.
fn pipeline(file: &Path, pre: &str) -> Result<(Value, Value, Value, Value), BuilderError> {
    Ok(match pre {
        // GPT-2 regex inside ByteLevel.
        "default" | "gpt2" | "mpt" | "olmo" | "jais" => (
            Value::Null,
            byte_level(false, true, true),
            byte_level(true, false, true),
            byte_level(true, true, true),
        ),
        // llama.cpp: regexes {"\p{N}", GPT-2}; HF (StarCoder, SmolLM): Digits(individual) then
        // ByteLevel with its GPT-2 regex.
        "smollm" | "starcoder" | "refact" | "codeshell" | "command-r" | "exaone" | "minerva" => (
            Value::Null,
            json!({ "type": "Sequence", "pretokenizers": [
                { "type": "Digits", "individual_digits": true },
                byte_level(false, true, true),
            ]}),
            byte_level(true, false, true),
            byte_level(true, true, true),
        ),
        "qwen2" | "deepseek-r1-qwen" => (
            json!({ "type": "NFC" }),
            json!({ "type": "Sequence", "pretokenizers": [
                split(QWEN2_REGEX),
                byte_level(false, false, false),
            ]}),
            byte_level(false, false, false),
            byte_level(false, false, false),
        ),
        "llama3" | "llama-bpe" => (
            Value::Null,
            json!({ "type": "Sequence", "pretokenizers": [
                split(LLAMA3_REGEX),
                byte_level(false, true, false),
            ]}),
            byte_level(true, false, true),
            byte_level(true, true, true),
        ),
        other => {
            return Err(import_error(
                file,
                format!(
                    "metadata `tokenizer.ggml.pre` = {other:?} is not supported (supported: {})",
                    SUPPORTED_PRE_TOKENIZERS.join(", ")
                ),
            ))
        }
    })
}

/// Builds the tokenizer files; `None` when the GGUF has no tokenizer.
pub(crate) fn build(h: &GgufHeader, context: u64) -> Result<Option<TokenizerFiles>, BuilderError> {
    let file = h.path();
    let Some(tokens) = h.strings_opt("tokenizer.ggml.tokens")? else {
        return Ok(None);
    };
    let model = h.str_opt("tokenizer.ggml.model")?.unwrap_or("gpt2");
    if model != "gpt2" {
        return Err(import_error(
            file,
            format!(
                "metadata `tokenizer.ggml.model` = {model:?} is not supported (supported: \"gpt2\", byte-level BPE{})",
                if model == "llama" { "; SentencePiece vocabularies are not" } else { "" }
            ),
        ));
    }
    let pre = h.str_opt("tokenizer.ggml.pre")?.unwrap_or("default");
    let (normalizer, pre_tokenizer, post_base, decoder) = pipeline(file, pre)?;

    let types = match h.i64s_opt("tokenizer.ggml.token_type")? {
        Some(t) if t.len() == tokens.len() => t,
        Some(t) => {
            return Err(import_error(
                file,
                format!(
                    "metadata `tokenizer.ggml.token_type` has {} entries for {} tokens",
                    t.len(),
                    tokens.len()
                ),
            ))
        }
        None => vec![NORMAL; tokens.len()],
    };
    let merges = h.strings_opt("tokenizer.ggml.merges")?.ok_or_else(|| {
        import_error(
            file,
            "metadata `tokenizer.ggml.merges`: missing (a BPE vocabulary needs its merges)",
        )
    })?;
    for (i, m) in merges.iter().enumerate() {
        let ok = m
            .split_once(' ')
            .is_some_and(|(a, b)| !a.is_empty() && !b.is_empty() && !b.contains(' '));
        if !ok {
            return Err(import_error(
                file,
                format!("metadata `tokenizer.ggml.merges`[{i}] = {m:?} is not two tokens separated by one space"),
            ));
        }
    }

    let id_key = |key: &str| -> Result<Option<usize>, BuilderError> {
        match h.u64_opt(key)? {
            None => Ok(None),
            Some(id) if (id as usize) < tokens.len() => Ok(Some(id as usize)),
            Some(id) => Err(import_error(
                file,
                format!(
                    "metadata `{key}` = {id} is not a token id (vocabulary of {})",
                    tokens.len()
                ),
            )),
        }
    };
    let bos = id_key("tokenizer.ggml.bos_token_id")?;
    let eos = id_key("tokenizer.ggml.eos_token_id")?;
    let unk = id_key("tokenizer.ggml.unknown_token_id")?;
    let pad = id_key("tokenizer.ggml.padding_token_id")?;
    let add_bos = h.bool_opt("tokenizer.ggml.add_bos_token")?.unwrap_or(false);
    let add_eos = h.bool_opt("tokenizer.ggml.add_eos_token")?.unwrap_or(false);

    let mut vocab = Map::with_capacity(tokens.len());
    let mut duplicate_tokens = 0;
    for (id, t) in tokens.iter().enumerate() {
        if vocab.contains_key(t) {
            duplicate_tokens += 1;
        } else {
            vocab.insert(t.clone(), json!(id));
        }
    }

    let mut added = Vec::new();
    let mut added_decoder = Map::new();
    let mut additional_special = Vec::new();
    for (id, (t, &ty)) in tokens.iter().zip(&types).enumerate() {
        let special = match ty {
            CONTROL | UNKNOWN => true,
            USER_DEFINED => false,
            _ => continue,
        };
        added.push(json!({
            "id": id, "content": t, "single_word": false, "lstrip": false, "rstrip": false,
            "normalized": false, "special": special,
        }));
        added_decoder.insert(
            id.to_string(),
            json!({
                "content": t, "lstrip": false, "normalized": false, "rstrip": false,
                "single_word": false, "special": special,
            }),
        );
        if special && ![bos, eos, unk, pad].contains(&Some(id)) {
            additional_special.push(t.clone());
        }
    }

    let post_processor = if (add_bos && bos.is_some()) || (add_eos && eos.is_some()) {
        let token = |id: usize| json!({ "SpecialToken": { "id": tokens[id], "type_id": 0 } });
        let seq = |s: &str, type_id: u32| json!({ "Sequence": { "id": s, "type_id": type_id } });
        let (mut single, mut pair) = (Vec::new(), Vec::new());
        let mut specials = Map::new();
        let b = bos.filter(|_| add_bos);
        let e = eos.filter(|_| add_eos);
        for id in b.into_iter().chain(e) {
            specials.insert(
                tokens[id].clone(),
                json!({ "id": tokens[id], "ids": [id], "tokens": [tokens[id]] }),
            );
        }
        single.extend(b.map(token));
        single.push(seq("A", 0));
        single.extend(e.map(token));
        pair.extend(single.iter().cloned());
        pair.extend(b.map(token));
        pair.push(seq("B", 1));
        pair.extend(e.map(token));
        json!({ "type": "Sequence", "processors": [
            post_base,
            { "type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": specials },
        ]})
    } else {
        post_base
    };

    let added_tokens = added.len();
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor,
        "decoder": decoder,
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": false,
            "byte_fallback": false,
            "ignore_merges": matches!(pre, "llama3" | "llama-bpe"),
            "vocab": vocab,
            "merges": merges,
        },
    });

    let chat_template = h.str_opt("tokenizer.chat_template")?;
    let name = |id: Option<usize>| {
        id.map(|i| Value::String(tokens[i].clone()))
            .unwrap_or(Value::Null)
    };
    let mut config = json!({
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "add_prefix_space": false,
        "added_tokens_decoder": added_decoder,
        "additional_special_tokens": additional_special,
        "bos_token": name(bos),
        "clean_up_tokenization_spaces": false,
        "eos_token": name(eos),
        "model_max_length": context,
        "pad_token": name(pad),
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": name(unk),
    });
    if let Some(t) = chat_template {
        config["chat_template"] = json!(t);
    }
    Ok(Some(TokenizerFiles {
        tokenizer,
        config,
        summary: TokenizerSummary {
            pre_tokenizer: pre.to_owned(),
            vocab_size: tokens.len(),
            merges: merges.len(),
            added_tokens,
            duplicate_tokens,
            chat_template: chat_template.is_some(),
        },
    }))
}
