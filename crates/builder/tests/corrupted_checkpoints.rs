//! The corrupted-checkpoint set: each case rewrites one thing of a good checkpoint (a config
//! field, a tensor's dtype or shape, a missing tensor) into something no loader accepts, and
//! `quantize`, `inspect` and `verify` must all refuse it, naming what is wrong. One validation
//! ([`fp4forge_builder::validate`]) serves all three.

use std::fs;
use std::path::{Path, PathBuf};

use fp4forge_builder::build::{NoProgress, QuantizeBuilder};
use fp4forge_builder::inspect::Inspector;
use fp4forge_builder::verify::verify;
use fp4forge_format::{Checkpoint, Dtype, ShardWriterBuilder, TensorSpec};
use serde_json::{json, Value};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tiny-laguna")
        .join(name)
}

/// One stored tensor: name, dtype, shape, bytes.
type Tensor = (String, Dtype, Vec<usize>, Vec<u8>);

/// Copies fixture `base` into `dir`, passing its tensors through `tensors` and its config through
/// `config`.
fn rewrite(
    base: &str,
    dir: &Path,
    tensors: impl Fn(&mut Vec<Tensor>),
    config: impl Fn(&mut Value),
) -> PathBuf {
    let src = Checkpoint::open(fixture(base)).unwrap();
    let mut list: Vec<Tensor> = src
        .tensors()
        .map(|e| {
            (
                e.name().to_string(),
                e.info.dtype,
                e.info.shape.clone(),
                e.bytes().to_vec(),
            )
        })
        .collect();
    tensors(&mut list);
    fs::create_dir_all(dir).unwrap();
    let specs: Vec<TensorSpec> = list
        .iter()
        .map(|t| TensorSpec::new(t.0.clone(), t.1, t.2.clone()))
        .collect();
    let writer = ShardWriterBuilder::new().create(dir, specs).unwrap();
    for t in &list {
        writer.write(&t.0, &t.3).unwrap();
    }
    writer.finish().unwrap();
    let mut cfg: Value =
        serde_json::from_slice(&fs::read(fixture(base).join("config.json")).unwrap()).unwrap();
    config(&mut cfg);
    fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    dir.to_path_buf()
}

const Q: &str = "model.layers.0.self_attn.q_proj";

fn find<'a>(list: &'a mut [Tensor], name: &str) -> &'a mut Tensor {
    list.iter_mut().find(|t| t.0 == name).unwrap()
}

fn drop_tensor(name: &'static str) -> impl Fn(&mut Vec<Tensor>) {
    move |list| list.retain(|t| t.0 != name)
}

fn reshape(name: &'static str, shape: &'static [usize]) -> impl Fn(&mut Vec<Tensor>) {
    move |list| find(list, name).2 = shape.to_vec()
}

fn same<T>(_: &mut T) {}

/// A corruption: the fixture it starts from, what it does, and a word the refusal must contain.
struct Case {
    name: &'static str,
    base: &'static str,
    expect: &'static str,
    dir: PathBuf,
}

/// Every command refuses the case, and the refusal contains `case.expect`.
fn assert_refused_everywhere(case: &Case, scratch: &Path) {
    let dst = scratch.join(format!("{}-out", case.name));
    let refusals = [
        (
            "quantize",
            QuantizeBuilder::new(&case.dir, &dst)
                .run(&NoProgress)
                .map(|_| ()),
        ),
        (
            "inspect",
            Inspector::new().inspect_path(&case.dir).map(|_| ()),
        ),
        (
            "verify",
            // A corrupted source, or a corrupted build of the good source.
            if case.base == "bf16" {
                verify(&case.dir, &fixture("ref_qkvo")).map(|_| ())
            } else {
                verify(&fixture(case.base_source()), &case.dir).map(|_| ())
            },
        ),
    ];
    for (command, result) in refusals {
        let msg = match result {
            Ok(()) => panic!("{}: {command} accepted it", case.name),
            Err(e) => e.to_string(),
        };
        assert!(
            msg.contains(case.expect),
            "{}: {command} refused it without naming {:?}: {msg}",
            case.name,
            case.expect
        );
    }
    assert!(
        !dst.exists(),
        "{}: quantize wrote {}",
        case.name,
        dst.display()
    );
}

impl Case {
    /// The checkpoint a built `base` came from.
    fn base_source(&self) -> &'static str {
        match self.base {
            "ref_qkvo" | "ref_all_linear" => "bf16",
            "ref_stock_qkvo" => "stock",
            other => other,
        }
    }
}

#[test]
fn every_corruption_is_refused_by_quantize_inspect_and_verify() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cases = Vec::new();
    let mut add = |name: &'static str,
                   base: &'static str,
                   expect: &'static str,
                   tensors: &dyn Fn(&mut Vec<Tensor>),
                   config: &dyn Fn(&mut Value)| {
        let dir = rewrite(base, &tmp.path().join(name), tensors, config);
        cases.push(Case {
            name,
            base,
            expect,
            dir,
        });
    };
    let q_weight = "model.layers.0.self_attn.q_proj.weight";
    // A rewritten shape of a BF16 weight, same bytes: 1-D and 3-D.
    add(
        "q-1d",
        "bf16",
        q_weight,
        &reshape("model.layers.0.self_attn.q_proj.weight", &[4096]),
        &same,
    );
    add(
        "q-3d",
        "bf16",
        q_weight,
        &reshape("model.layers.0.self_attn.q_proj.weight", &[4, 16, 64]),
        &same,
    );
    // Incomplete or ill-formed NVFP4 modules, in a lean build and in the stock layout.
    for (name, leaf) in [
        ("no-scale", "weight_scale"),
        ("no-global-scale", "weight_global_scale"),
        ("no-packed", "weight_packed"),
    ] {
        let full: &'static str = Box::leak(format!("{Q}.{leaf}").into_boxed_str());
        add(name, "ref_qkvo", full, &drop_tensor(full), &same);
    }
    add(
        "scale-bf16",
        "ref_qkvo",
        "expected F8_E4M3",
        &|list| {
            let t = find(list, &format!("{Q}.weight_scale"));
            t.1 = Dtype::BF16;
            t.3 = t.3.iter().flat_map(|&b| [0, b]).collect();
        },
        &same,
    );
    add(
        "packed-2r-c4",
        "ref_qkvo",
        "expected [64, 32]",
        &reshape("model.layers.0.self_attn.q_proj.weight_packed", &[128, 16]),
        &same,
    );
    add(
        "packed-1d",
        "ref_qkvo",
        "weight_packed",
        &reshape("model.layers.0.self_attn.q_proj.weight_packed", &[2048]),
        &same,
    );
    add(
        "stock-no-input-scale",
        "stock",
        "input_global_scale",
        &drop_tensor("model.layers.1.mlp.experts.0.up_proj.input_global_scale"),
        &same,
    );
    add(
        "a16-with-input-scale",
        "ref_qkvo",
        "input_global_scale",
        &|list| {
            list.push((
                format!("{Q}.input_global_scale"),
                Dtype::F32,
                vec![1],
                1f32.to_le_bytes().to_vec(),
            ))
        },
        &same,
    );
    add(
        "packed-no-group",
        "ref_qkvo",
        "no quantization_config group",
        &same,
        &|c| {
            let ignore = c["quantization_config"]["ignore"].as_array_mut().unwrap();
            ignore.push(json!("model.layers.0.self_attn.o_proj"));
        },
    );
    // Configs: another method, an unknown format, 3 bits, nothing at all.
    for base in ["bf16", "ref_qkvo"] {
        let tag = |s: &str| -> &'static str { Box::leak(format!("{base}-{s}").into_boxed_str()) };
        add(tag("awq"), base, "quant_method", &same, &|c| {
            let q = c
                .as_object_mut()
                .unwrap()
                .entry("quantization_config")
                .or_insert(json!({}));
            q["quant_method"] = json!("awq");
        });
        add(tag("empty-config"), base, "hidden_size", &same, &|c| {
            *c = json!({})
        });
    }
    add("unknown-format", "ref_qkvo", "format", &same, &|c| {
        c["quantization_config"]["format"] = json!("int-quantized-v9");
    });
    add("unknown-group-format", "ref_qkvo", "format", &same, &|c| {
        c["quantization_config"]["config_groups"]["group_0"]["format"] = json!("sparse-24");
    });
    add("3-bits", "ref_qkvo", "num_bits", &same, &|c| {
        c["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] = json!(3);
    });

    for case in &cases {
        assert_refused_everywhere(case, tmp.path());
    }
    assert_eq!(cases.len(), 18);
}

#[test]
fn the_uncorrupted_fixtures_pass_all_three() {
    for name in [
        "bf16",
        "stock",
        "ref_qkvo",
        "ref_all_linear",
        "ref_stock_qkvo",
    ] {
        Inspector::new().inspect_path(&fixture(name)).unwrap();
    }
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("lean");
    QuantizeBuilder::new(fixture("stock"), &dst)
        .run(&NoProgress)
        .unwrap();
    assert!(verify(&fixture("stock"), &dst).unwrap().passed());
}

/// Without a family whose tensor names are known (no geometry to compare with), a projection
/// whose weight was rewritten to 1-D is still a member of its fused group, by name: quantize
/// refuses rather than quantize k/v and leave q BF16.
#[test]
fn a_rewritten_fused_sibling_is_refused_without_geometry() {
    let tmp = tempfile::tempdir().unwrap();
    let strip_family = |c: &mut Value| {
        let map = c.as_object_mut().unwrap();
        map.remove("model_type");
        map.remove("architectures");
    };
    let src = rewrite(
        "bf16",
        &tmp.path().join("src"),
        reshape("model.layers.0.self_attn.q_proj.weight", &[4096]),
        strip_family,
    );
    for targets in [
        vec![r"re:.*self_attn\.(q|k|v|o)_proj$".to_string()],
        vec![r"re:model\.layers\.0\.self_attn\.(q|k|v)_proj$".to_string()],
    ] {
        let err = QuantizeBuilder::new(&src, tmp.path().join("out"))
            .targets(targets.clone())
            .run(&NoProgress)
            .unwrap_err()
            .to_string();
        assert!(err.contains(Q), "{targets:?}: {err}");
        assert!(!tmp.path().join("out").exists());
    }
}
