//! Checkpoint reading and shard writing: round trips, byte equality with the `safetensors`
//! crate, and the errors of broken checkpoint directories.

use std::collections::HashMap;
use std::path::Path;

use fp4forge_format::checkpoint::{INDEX_FILE_NAME, SINGLE_FILE_NAME};
use fp4forge_format::{
    Checkpoint, CheckpointError, Dtype, SafetensorsFile, ShardIndex, ShardWriterBuilder, TensorSpec,
};
use indexmap::IndexMap;

/// Deterministic test bytes for a tensor.
fn fill(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn specs() -> Vec<TensorSpec> {
    vec![
        TensorSpec::new("model.embed_tokens.weight", Dtype::BF16, [16, 8]),
        TensorSpec::new(
            "model.layers.0.self_attn.q_proj.weight_packed",
            Dtype::U8,
            [8, 4],
        ),
        TensorSpec::new(
            "model.layers.0.self_attn.q_proj.weight_scale",
            Dtype::F8_E4M3,
            [8, 1],
        ),
        TensorSpec::new(
            "model.layers.0.self_attn.q_proj.weight_global_scale",
            Dtype::F32,
            [1],
        ),
        TensorSpec::new("model.norm.weight", Dtype::BF16, [8]),
        TensorSpec::new("empty", Dtype::F32, [0, 3]),
        TensorSpec::new("lm_head.weight", Dtype::BF16, [16, 8]),
    ]
}

/// Writes `specs` into `dir` with the given shard size, tensors written in reverse order.
fn write_all(dir: &Path, specs: &[TensorSpec], max: u64) -> fp4forge_format::WrittenCheckpoint {
    let w = ShardWriterBuilder::new()
        .max_shard_bytes(max)
        .create(dir, specs.to_vec())
        .unwrap();
    for (i, s) in specs.iter().enumerate().rev() {
        let len = s.byte_len().unwrap() as usize;
        w.write(&s.name, &fill(i as u8, len)).unwrap();
    }
    w.finish().unwrap()
}

#[test]
fn single_shard_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let specs = specs();
    let out = write_all(dir.path(), &specs, u64::MAX);
    assert_eq!(out.shards, vec![SINGLE_FILE_NAME.to_owned()]);
    assert_eq!(out.index, None);
    assert!(!dir.path().join(INDEX_FILE_NAME).exists());

    let ckpt = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(ckpt.len(), specs.len());
    let names: Vec<&str> = ckpt.tensors().map(|e| e.name()).collect();
    let declared: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, declared, "file order is declaration order");
    for (i, s) in specs.iter().enumerate() {
        let e = ckpt.get(&s.name).unwrap();
        assert_eq!(e.info.dtype, s.dtype);
        assert_eq!(e.info.shape, s.shape);
        let len = s.byte_len().unwrap() as usize;
        assert_eq!(e.bytes(), fill(i as u8, len).as_slice());
        assert_eq!(ckpt.bytes(&s.name).unwrap(), e.bytes());
    }
    let shard = &ckpt.shards()[0];
    assert_eq!(
        shard.metadata().unwrap().get("format").map(String::as_str),
        Some("pt")
    );
    assert_eq!(shard.header().data_start() % 8, 0);
    assert!(matches!(
        ckpt.bytes("nope"),
        Err(CheckpointError::MissingTensor { .. })
    ));
    // The safetensors crate reads it too.
    let raw = std::fs::read(dir.path().join(SINGLE_FILE_NAME)).unwrap();
    let st = safetensors::SafeTensors::deserialize(&raw).unwrap();
    assert_eq!(st.len(), specs.len());
    assert_eq!(
        st.tensor("lm_head.weight").unwrap().data(),
        ckpt.bytes("lm_head.weight").unwrap()
    );
}

#[test]
fn multi_shard_round_trip_with_concurrent_writes() {
    let dir = tempfile::tempdir().unwrap();
    let specs = specs();
    let w = ShardWriterBuilder::new()
        .max_shard_bytes(300)
        .create(dir.path(), specs.clone())
        .unwrap();
    let names: Vec<&str> = w.shard_names().collect();
    assert_eq!(
        names,
        [
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors"
        ]
    );
    assert_eq!(
        w.shard_of("lm_head.weight"),
        Some("model-00002-of-00002.safetensors")
    );
    std::thread::scope(|scope| {
        for (i, s) in specs.iter().enumerate() {
            let w = &w;
            scope.spawn(move || {
                let len = s.byte_len().unwrap() as usize;
                w.write(&s.name, &fill(i as u8, len)).unwrap();
            });
        }
    });
    assert_eq!(w.pending(), 0);
    let out = w.finish().unwrap();
    let total: u64 = specs.iter().map(|s| s.byte_len().unwrap()).sum();
    assert_eq!(out.total_size, total);
    assert_eq!(out.index, Some(dir.path().join(INDEX_FILE_NAME)));

    let index = ShardIndex::from_path(&dir.path().join(INDEX_FILE_NAME)).unwrap();
    assert_eq!(index.total_size(), Some(total));
    let keys: Vec<&String> = index.weight_map.keys().collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(
        keys, sorted,
        "weight_map keys are sorted like transformers writes them"
    );

    let ckpt = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(ckpt.shards().len(), 2);
    for (i, s) in specs.iter().enumerate() {
        let len = s.byte_len().unwrap() as usize;
        assert_eq!(ckpt.bytes(&s.name).unwrap(), fill(i as u8, len).as_slice());
    }
    // Nothing but the shards and the index.
    let mut files: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            INDEX_FILE_NAME
        ]
    );
}

#[test]
fn single_shard_index_on_request() {
    let dir = tempfile::tempdir().unwrap();
    let w = ShardWriterBuilder::new()
        .always_write_index(true)
        .create(dir.path(), [TensorSpec::new("a", Dtype::F32, [2])])
        .unwrap();
    w.write("a", &[0; 8]).unwrap();
    let out = w.finish().unwrap();
    assert!(out.index.is_some());
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(
        ckpt.index()
            .unwrap()
            .weight_map
            .get("a")
            .map(String::as_str),
        Some(SINGLE_FILE_NAME)
    );
}

#[test]
fn bytes_equal_safetensors_serialize() {
    // Declared in the order safetensors::serialize sorts: dtype alignment descending, then name.
    let tensors: Vec<(&str, Dtype, safetensors::Dtype, Vec<usize>)> = vec![
        ("b.scale", Dtype::F32, safetensors::Dtype::F32, vec![1]),
        (
            "a.weight",
            Dtype::BF16,
            safetensors::Dtype::BF16,
            vec![3, 5],
        ),
        ("c.bias", Dtype::BF16, safetensors::Dtype::BF16, vec![3]),
        ("a.packed", Dtype::U8, safetensors::Dtype::U8, vec![3, 3]),
    ];
    let data: Vec<Vec<u8>> = tensors
        .iter()
        .enumerate()
        .map(|(i, (_, d, _, shape))| fill(i as u8, d.byte_len(shape).unwrap() as usize))
        .collect();
    let views: Vec<(&str, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .zip(&data)
        .map(|((name, _, st, shape), bytes)| {
            (
                *name,
                safetensors::tensor::TensorView::new(*st, shape.clone(), bytes).unwrap(),
            )
        })
        .collect();
    let meta = HashMap::from([("format".to_owned(), "pt".to_owned())]);
    let expected = safetensors::serialize(views, Some(meta)).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let specs: Vec<TensorSpec> = tensors
        .iter()
        .map(|(n, d, _, s)| TensorSpec::new(*n, *d, s.clone()))
        .collect();
    let w = ShardWriterBuilder::new().create(dir.path(), specs).unwrap();
    for ((name, ..), bytes) in tensors.iter().zip(&data) {
        w.write(name, bytes).unwrap();
    }
    w.finish().unwrap();
    let ours = std::fs::read(dir.path().join(SINGLE_FILE_NAME)).unwrap();
    assert_eq!(ours, expected);
}

#[test]
fn writer_rejects_misuse_and_cleans_up() {
    let dir = tempfile::tempdir().unwrap();
    let dup = ShardWriterBuilder::new().create(
        dir.path(),
        [
            TensorSpec::new("a", Dtype::F32, [1]),
            TensorSpec::new("a", Dtype::F32, [1]),
        ],
    );
    assert!(matches!(dup, Err(CheckpointError::Write { ref tensor, .. }) if tensor == "a"));
    let huge = ShardWriterBuilder::new().create(
        dir.path(),
        [TensorSpec::new("h", Dtype::F64, [usize::MAX, 4])],
    );
    assert!(matches!(huge, Err(CheckpointError::Write { ref tensor, .. }) if tensor == "h"));

    let w = ShardWriterBuilder::new()
        .create(
            dir.path(),
            [
                TensorSpec::new("a", Dtype::F32, [2]),
                TensorSpec::new("b", Dtype::F32, [2]),
            ],
        )
        .unwrap();
    let unknown = w.write("zzz", &[0; 8]).unwrap_err();
    assert!(unknown.to_string().contains("zzz"), "{unknown}");
    let short = w.write("a", &[0; 7]).unwrap_err();
    assert!(short.to_string().contains("7 bytes"), "{short}");
    w.write("a", &[0; 8]).unwrap();
    let twice = w.write("a", &[0; 8]).unwrap_err();
    assert!(twice.to_string().contains("twice"), "{twice}");
    assert!(dir.path().join("model.safetensors.partial").exists());
    let incomplete = w.finish().unwrap_err();
    assert!(
        matches!(incomplete, CheckpointError::Write { ref tensor, ref reason, .. }
            if tensor == "b" && reason.contains("never written")),
        "{incomplete}"
    );
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "partials removed"
    );
}

#[test]
fn zero_tensors_make_a_valid_empty_file() {
    let dir = tempfile::tempdir().unwrap();
    let w = ShardWriterBuilder::new()
        .metadata(None)
        .create(dir.path(), Vec::new())
        .unwrap();
    w.finish().unwrap();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    assert!(ckpt.is_empty());
    assert!(ckpt.shards()[0].metadata().is_none());
}

/// A two-shard checkpoint whose index the test then edits.
fn two_shards(dir: &Path) {
    let specs = vec![
        TensorSpec::new("a", Dtype::F32, [4]),
        TensorSpec::new("b", Dtype::F32, [4]),
    ];
    write_all(dir, &specs, 16);
}

fn edit_index(dir: &Path, edit: impl FnOnce(&mut ShardIndex)) {
    let path = dir.join(INDEX_FILE_NAME);
    let mut index = ShardIndex::from_path(&path).unwrap();
    edit(&mut index);
    std::fs::write(&path, serde_json::to_vec(&index).unwrap()).unwrap();
}

#[test]
fn missing_shard_is_named() {
    let dir = tempfile::tempdir().unwrap();
    two_shards(dir.path());
    std::fs::remove_file(dir.path().join("model-00002-of-00002.safetensors")).unwrap();
    let err = Checkpoint::open(dir.path()).unwrap_err();
    assert!(
        matches!(err, CheckpointError::MissingShard { ref shard, .. }
            if shard == "model-00002-of-00002.safetensors"),
        "{err}"
    );
    assert!(err.to_string().contains("model-00002-of-00002.safetensors"));
}

#[test]
fn index_pointing_at_tensor_not_in_shard() {
    let dir = tempfile::tempdir().unwrap();
    two_shards(dir.path());
    edit_index(dir.path(), |i| {
        i.weight_map
            .insert("ghost".into(), "model-00001-of-00002.safetensors".into());
    });
    let err = Checkpoint::open(dir.path()).unwrap_err();
    assert!(
        matches!(err, CheckpointError::IndexMismatch { ref tensor, ref shard, .. }
            if tensor == "ghost" && shard == "model-00001-of-00002.safetensors"),
        "{err}"
    );
}

#[test]
fn index_naming_the_wrong_shard() {
    let dir = tempfile::tempdir().unwrap();
    two_shards(dir.path());
    edit_index(dir.path(), |i| {
        i.weight_map
            .insert("a".into(), "model-00002-of-00002.safetensors".into());
    });
    let err = Checkpoint::open(dir.path()).unwrap_err();
    assert!(
        matches!(err, CheckpointError::IndexMismatch { ref tensor, .. } if tensor == "a"),
        "{err}"
    );
}

#[test]
fn shard_tensor_missing_from_index() {
    let dir = tempfile::tempdir().unwrap();
    write_all(
        dir.path(),
        &[
            TensorSpec::new("a", Dtype::F32, [4]),
            TensorSpec::new("c", Dtype::F32, [1]),
            TensorSpec::new("b", Dtype::F32, [4]),
        ],
        20,
    );
    edit_index(dir.path(), |i| {
        i.weight_map.shift_remove("c");
    });
    let err = Checkpoint::open(dir.path()).unwrap_err();
    assert!(
        matches!(err, CheckpointError::IndexMismatch { ref tensor, ref shard, .. }
            if tensor == "c" && shard == "model-00001-of-00002.safetensors"),
        "{err}"
    );
}

#[test]
fn index_cannot_escape_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    two_shards(dir.path());
    edit_index(dir.path(), |i| {
        i.weight_map.insert("a".into(), "../x.safetensors".into());
    });
    let err = Checkpoint::open(dir.path()).unwrap_err();
    assert!(
        matches!(err, CheckpointError::IndexMismatch { .. }),
        "{err}"
    );
}

#[test]
fn malformed_index_is_a_json_error() {
    let dir = tempfile::tempdir().unwrap();
    two_shards(dir.path());
    std::fs::write(dir.path().join(INDEX_FILE_NAME), b"{\"weight_map\": [1]}").unwrap();
    let err = Checkpoint::open(dir.path()).unwrap_err();
    assert!(matches!(err, CheckpointError::Json { .. }), "{err}");
}

#[test]
fn truncated_file_names_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    write_all(dir.path(), &specs(), u64::MAX);
    let path = dir.path().join(SINGLE_FILE_NAME);
    let len = std::fs::metadata(&path).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(len - 3).unwrap();
    drop(f);
    let err = SafetensorsFile::open(&path).unwrap_err();
    assert!(
        matches!(err, CheckpointError::Truncated { ref tensor, .. } if tensor == "lm_head.weight"),
        "{err}"
    );
    let err = Checkpoint::open(dir.path()).unwrap_err();
    assert!(err.to_string().contains("model.safetensors"), "{err}");
}

#[test]
fn layout_detection_and_other_files() {
    let dir = tempfile::tempdir().unwrap();
    let err = Checkpoint::open(dir.path()).unwrap_err();
    assert!(matches!(err, CheckpointError::Layout { .. }), "{err}");

    write_all(dir.path(), &specs(), u64::MAX);
    std::fs::rename(
        dir.path().join(SINGLE_FILE_NAME),
        dir.path().join("weights.safetensors"),
    )
    .unwrap();
    assert_eq!(Checkpoint::open(dir.path()).unwrap().len(), specs().len());

    std::fs::copy(
        dir.path().join("weights.safetensors"),
        dir.path().join("other.safetensors"),
    )
    .unwrap();
    let err = Checkpoint::open(dir.path()).unwrap_err();
    assert!(matches!(err, CheckpointError::Layout { .. }), "{err}");
    std::fs::remove_file(dir.path().join("other.safetensors")).unwrap();

    for name in [
        "config.json",
        "tokenizer.json",
        "chat_template.jinja",
        "generation_config.json",
        "LICENSE",
        "README.md",
        ".gitattributes",
        "pytorch_model.bin",
    ] {
        std::fs::write(dir.path().join(name), b"x").unwrap();
    }
    std::fs::create_dir(dir.path().join("original")).unwrap();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(
        ckpt.other_files().unwrap(),
        [
            "LICENSE",
            "README.md",
            "chat_template.jinja",
            "generation_config.json",
            "tokenizer.json"
        ]
    );
    assert_eq!(ckpt.config_path(), dir.path().join("config.json"));
    assert!(matches!(ckpt.config(), Err(CheckpointError::Json { .. })));
    std::fs::write(
        dir.path().join("config.json"),
        br#"{"model_type": "laguna"}"#,
    )
    .unwrap();
    let cfg = ckpt.config().unwrap();
    assert_eq!(cfg.model_type.get().map(String::as_str), Some("laguna"));
}

#[test]
fn header_metadata_is_kept_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let meta = IndexMap::from([
        ("zeta".to_owned(), "1".to_owned()),
        ("alpha".to_owned(), "2".to_owned()),
    ]);
    let w = ShardWriterBuilder::new()
        .metadata(Some(meta.clone()))
        .create(dir.path(), [TensorSpec::new("x", Dtype::I64, [2])])
        .unwrap();
    w.write("x", &[1; 16]).unwrap();
    w.finish().unwrap();
    let f = SafetensorsFile::open(dir.path().join(SINGLE_FILE_NAME)).unwrap();
    let keys: Vec<&String> = f.metadata().unwrap().keys().collect();
    assert_eq!(keys, ["zeta", "alpha"]);
}

/// Reads a sharded output with the Python `safetensors` library (run by hand:
/// `cargo test -p fp4forge-format --test checkpoint_io -- --ignored`).
#[test]
#[ignore = "needs python3 with safetensors and numpy"]
fn python_safetensors_reads_our_shards() {
    let dir = tempfile::tempdir().unwrap();
    let specs = vec![
        TensorSpec::new("u8", Dtype::U8, [3, 5]),
        TensorSpec::new("f32", Dtype::F32, [2, 2]),
        TensorSpec::new("f16", Dtype::F16, [7]),
        TensorSpec::new("i64", Dtype::I64, [1]),
        TensorSpec::new("scalar", Dtype::F64, []),
        TensorSpec::new("flags", Dtype::BOOL, [0]),
        TensorSpec::new("i16", Dtype::I16, [2, 1, 2]),
    ];
    write_all(dir.path(), &specs, 24);
    let script = r#"
import json, sys, os
from safetensors.numpy import load_file
d = sys.argv[1]
idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))
out = {}
for shard in sorted(set(idx["weight_map"].values())):
    for k, v in load_file(os.path.join(d, shard)).items():
        out[k] = [list(v.shape), v.tobytes().hex()]
print(json.dumps(out))
"#;
    let py = std::process::Command::new("python3")
        .args(["-c", script, dir.path().to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        py.status.success(),
        "{}",
        String::from_utf8_lossy(&py.stderr)
    );
    let got: serde_json::Value = serde_json::from_slice(&py.stdout).unwrap();
    assert_eq!(got.as_object().unwrap().len(), specs.len());
    for (i, s) in specs.iter().enumerate() {
        let len = s.byte_len().unwrap() as usize;
        let hex: String = fill(i as u8, len)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            got[&s.name][1],
            serde_json::Value::String(hex),
            "{}",
            s.name
        );
        assert_eq!(got[&s.name][0], serde_json::json!(s.shape), "{}", s.name);
    }
}
