//! A tiny Llama checkpoint whose greedy output is a script: every token's successor is fixed
//! (a bigram table), so a prompt ending in a given token always generates the same text. Tests
//! of the agentic API use it to make the model "call a tool" or "think" through the real server.
//!
//! How: hidden size = vocabulary size, the embedding is the identity, attention and MLP write
//! nothing (`o_proj` and `down_proj` are zero), so the final hidden state is the current
//! token's one-hot vector (times √V after the norm), and `lm_head` row `next(t)` has a 1 in
//! column `t`. The tokenizer is a WordLevel model whose tokens are all added tokens (matched
//! anywhere in text; `special` ones are dropped by decoding unless special tokens are kept),
//! decoded by concatenation.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{json, Value};

/// The real Laguna-S-2.1 chat template.
pub const LAGUNA_TEMPLATE: &str = include_str!(
    "../../../engine/tests/fixtures/chat_templates/templates/poolside-Laguna-S-2.1.jinja"
);

/// The Laguna agent's script: after the generation prompt (`<think>` with thinking on,
/// `</think>` off) it thinks "Paris is a city.", then says "Checking." and calls
/// `get_weather(city="Paris")`.
pub const LAGUNA_AGENT: &[(&str, &str)] = &[
    ("<think>", "Paris is a city."),
    ("Paris is a city.", "</think>"),
    ("</think>", "Checking."),
    ("Checking.", "<tool_call>"),
    ("<tool_call>", "get_weather"),
    ("get_weather", "<arg_key>"),
    ("<arg_key>", "city"),
    ("city", "</arg_key>"),
    ("</arg_key>", "<arg_value>"),
    ("<arg_value>", "Paris"),
    ("Paris", "</arg_value>"),
    ("</arg_value>", "</tool_call>"),
    ("</tool_call>", "</s>"),
];

/// The Laguna tags, special tokens of the agent's tokenizer (dropped from text unless special
/// tokens are kept).
pub const LAGUNA_SPECIAL: &[&str] = &[
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
];

/// Writes the scripted Laguna agent (the real Laguna-S-2.1 template, [`LAGUNA_AGENT`]) to `dir`.
pub fn write_laguna_agent(dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    write_script_model(dir, LAGUNA_AGENT, LAGUNA_SPECIAL, LAGUNA_TEMPLATE)
}

/// Unknown text, BOS and EOS.
const BASE: [&str; 3] = ["<unk>", "<s>", "</s>"];

/// Writes the checkpoint to `dir`: `chain` lists (token, next token) pairs, every other token
/// is followed by `</s>`; tokens in `special` are special tokens; `template` is the chat
/// template.
pub fn write_script_model(
    dir: &Path,
    chain: &[(&str, &str)],
    special: &[&str],
    template: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    std::fs::create_dir_all(dir)?;
    let mut vocab: Vec<String> = BASE.iter().map(|s| s.to_string()).collect();
    for (a, b) in chain {
        for t in [a, b] {
            if !vocab.iter().any(|v| v == t) {
                vocab.push(t.to_string());
            }
        }
    }
    let v = vocab.len();
    let id = |t: &str| vocab.iter().position(|x| x == t).expect("in vocab");
    let mut next: Vec<usize> = vec![id("</s>"); v];
    for (a, b) in chain {
        next[id(a)] = id(b);
    }

    // Weights, f32.
    let zeros = |r: usize, c: usize| vec![0f32; r * c];
    let mut eye = zeros(v, v);
    let mut head = zeros(v, v);
    for t in 0..v {
        eye[t * v + t] = 1.0;
        head[next[t] * v + t] = 1.0;
    }
    let ones = vec![1f32; v];
    let tensors: Vec<(&str, Vec<usize>, Vec<f32>)> = vec![
        ("model.embed_tokens.weight", vec![v, v], eye),
        ("lm_head.weight", vec![v, v], head),
        ("model.norm.weight", vec![v], ones.clone()),
        (
            "model.layers.0.input_layernorm.weight",
            vec![v],
            ones.clone(),
        ),
        (
            "model.layers.0.post_attention_layernorm.weight",
            vec![v],
            ones,
        ),
        (
            "model.layers.0.self_attn.q_proj.weight",
            vec![v, v],
            zeros(v, v),
        ),
        (
            "model.layers.0.self_attn.k_proj.weight",
            vec![v, v],
            zeros(v, v),
        ),
        (
            "model.layers.0.self_attn.v_proj.weight",
            vec![v, v],
            zeros(v, v),
        ),
        (
            "model.layers.0.self_attn.o_proj.weight",
            vec![v, v],
            zeros(v, v),
        ),
        (
            "model.layers.0.mlp.gate_proj.weight",
            vec![4, v],
            zeros(4, v),
        ),
        ("model.layers.0.mlp.up_proj.weight", vec![4, v], zeros(4, v)),
        (
            "model.layers.0.mlp.down_proj.weight",
            vec![v, 4],
            zeros(v, 4),
        ),
    ];
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .into_iter()
        .map(|(n, shape, data)| {
            let b = data.iter().flat_map(|x| x.to_le_bytes()).collect();
            (n.to_string(), shape, b)
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = bytes
        .iter()
        .map(|(n, shape, b)| {
            let view =
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), b)
                    .expect("tensor view");
            (n.clone(), view)
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors"))?;

    let config = json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": v,
        "intermediate_size": 4,
        "num_hidden_layers": 1,
        "num_attention_heads": 1,
        "num_key_value_heads": 1,
        "head_dim": v,
        "vocab_size": v,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": false,
        "bos_token_id": id("<s>"),
        "eos_token_id": id("</s>"),
        "torch_dtype": "float32",
    });
    std::fs::write(dir.join("config.json"), config.to_string())?;
    std::fs::write(
        dir.join("generation_config.json"),
        json!({"eos_token_id": id("</s>"), "bos_token_id": id("<s>")}).to_string(),
    )?;
    std::fs::write(
        dir.join("tokenizer_config.json"),
        json!({"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": false}).to_string(),
    )?;
    std::fs::write(dir.join("chat_template.jinja"), template)?;

    let word_vocab: BTreeMap<String, usize> = vocab
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i))
        .collect();
    let added: Vec<Value> = vocab
        .iter()
        .enumerate()
        .skip(1)
        .map(|(i, t)| {
            json!({"id": i, "content": t, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false,
                   "special": BASE.contains(&t.as_str()) || special.contains(&t.as_str())})
        })
        .collect();
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": null,
        "decoder": {"type": "Fuse"},
        "model": {"type": "WordLevel", "vocab": word_vocab, "unk_token": "<unk>"},
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string())?;
    Ok(())
}
