//! `fp4forge quantize --untie-lm-head` through the binary on a tiny tied Llama: the dry run shows
//! the lm_head line, the build passes `verify`, `inspect` shows an NVFP4 lm_head and no tied one,
//! and a second untie of the output is refused by name.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use fp4forge_format::{Dtype, ShardWriterBuilder, TensorSpec};

const HIDDEN: usize = 64;
const VOCAB: usize = 96;

fn fp4forge(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fp4forge"))
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap()
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A tied one-layer Llama with seeded bf16 values.
fn tied_model(dir: &Path) -> PathBuf {
    fs::create_dir_all(dir).unwrap();
    let mut tensors: Vec<(String, Vec<usize>)> = vec![
        ("model.embed_tokens.weight".into(), vec![VOCAB, HIDDEN]),
        ("model.layers.0.input_layernorm.weight".into(), vec![HIDDEN]),
        (
            "model.layers.0.post_attention_layernorm.weight".into(),
            vec![HIDDEN],
        ),
    ];
    for (name, shape) in [
        ("self_attn.q_proj", [64, HIDDEN]),
        ("self_attn.k_proj", [32, HIDDEN]),
        ("self_attn.v_proj", [32, HIDDEN]),
        ("self_attn.o_proj", [HIDDEN, 64]),
        ("mlp.gate_proj", [128, HIDDEN]),
        ("mlp.up_proj", [128, HIDDEN]),
        ("mlp.down_proj", [HIDDEN, 128]),
    ] {
        tensors.push((format!("model.layers.0.{name}.weight"), shape.to_vec()));
    }
    tensors.push(("model.norm.weight".into(), vec![HIDDEN]));
    let specs: Vec<TensorSpec> = tensors
        .iter()
        .map(|(n, s)| TensorSpec::new(n.clone(), Dtype::BF16, s.clone()))
        .collect();
    let writer = ShardWriterBuilder::new().create(dir, specs).unwrap();
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    for (name, shape) in &tensors {
        let n: usize = shape.iter().product();
        let mut bytes = Vec::with_capacity(2 * n);
        for _ in 0..n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let v = ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.2;
            bytes.extend_from_slice(&((v.to_bits() >> 16) as u16).to_le_bytes());
        }
        writer.write(name, &bytes).unwrap();
    }
    writer.finish().unwrap();
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_hidden_layers": 1,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": true,
        "torch_dtype": "bfloat16",
        "vocab_size": VOCAB
    });
    fs::write(dir.join("config.json"), config.to_string()).unwrap();
    dir.to_path_buf()
}

#[test]
fn untie_lm_head_through_the_binary() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tied_model(&tmp.path().join("tied"));
    let dst = tmp.path().join("untied");
    let (src_s, dst_s) = (src.to_str().unwrap(), dst.to_str().unwrap());

    let out = fp4forge(&["quantize", src_s, dst_s, "--untie-lm-head", "--dry-run"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.contains("untied lm_head")
            && stdout.contains("from model.embed_tokens.weight")
            && stdout.contains(&format!("[{VOCAB}, {HIDDEN}]")),
        "{stdout}"
    );
    assert!(!dst.exists());

    let out = fp4forge(&["quantize", src_s, dst_s, "--untie-lm-head"]);
    assert!(out.status.success(), "{}", text(&out).1);
    let config: serde_json::Value =
        serde_json::from_slice(&fs::read(dst.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["tie_word_embeddings"], false);

    let out = fp4forge(&["verify", src_s, dst_s]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("untied"), "{stdout}");

    let out = fp4forge(&["inspect", dst_s, "--json"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let rows = report["components"].as_array().unwrap();
    let lm_head: Vec<&serde_json::Value> = rows
        .iter()
        .filter(|r| r["component"].as_str().unwrap_or("").contains("lm_head"))
        .collect();
    assert_eq!(lm_head.len(), 1, "{lm_head:?}");
    assert_eq!(lm_head[0]["component"], "lm_head");
    assert_eq!(lm_head[0]["tensors"], 3);
    let out = fp4forge(&["inspect", dst_s, "--against", src_s]);
    assert!(out.status.success(), "{}", text(&out).1);

    // Untying the untied output is refused by name.
    let again = tmp.path().join("again");
    let out = fp4forge(&[
        "quantize",
        dst_s,
        again.to_str().unwrap(),
        "--untie-lm-head",
    ]);
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(
        stderr.contains("--untie-lm-head") && stderr.contains("lm_head.weight_packed"),
        "{stderr}"
    );
    assert!(!again.exists());
}
