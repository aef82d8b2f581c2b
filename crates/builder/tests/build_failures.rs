//! Failure cases of `quantize`: each stops with an error naming what is wrong, leaves SRC
//! untouched and leaves no DST (and no staging directory) behind.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use fp4forge_builder::build::{NoProgress, Progress, QuantizeBuilder};
use fp4forge_builder::BuilderError;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tiny-laguna")
        .join(name)
}

/// Copies a fixture checkpoint into a scratch directory.
fn scratch_copy(name: &str, into: &Path) -> PathBuf {
    let dst = into.join(name);
    fs::create_dir_all(&dst).unwrap();
    for entry in fs::read_dir(fixture(name)).unwrap() {
        let entry = entry.unwrap();
        fs::copy(entry.path(), dst.join(entry.file_name())).unwrap();
    }
    dst
}

/// Every file of a directory with its bytes.
fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

/// Only these names may exist in `parent` after a failed build.
fn assert_no_output(parent: &Path, allowed: &[&str]) {
    let names: Vec<String> = fs::read_dir(parent)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !allowed.contains(&n.as_str()))
        .collect();
    assert!(names.is_empty(), "left behind: {names:?}");
}

#[test]
fn truncated_shard_names_the_file_and_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let src = scratch_copy("bf16", tmp.path());
    let shard = src.join("model.safetensors");
    let bytes = fs::read(&shard).unwrap();
    fs::write(&shard, &bytes[..bytes.len() - 1000]).unwrap();
    let before = snapshot(&src);
    let err = QuantizeBuilder::new(&src, tmp.path().join("out"))
        .run(&NoProgress)
        .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("model.safetensors"), "{msg}");
    assert_eq!(snapshot(&src), before);
    assert_no_output(tmp.path(), &["bf16"]);
}

#[test]
fn corrupt_header_is_an_error_not_a_panic() {
    let tmp = tempfile::tempdir().unwrap();
    let src = scratch_copy("bf16", tmp.path());
    let shard = src.join("model.safetensors");
    let mut bytes = fs::read(&shard).unwrap();
    bytes[20] = b'}';
    fs::write(&shard, &bytes).unwrap();
    let err = QuantizeBuilder::new(&src, tmp.path().join("out"))
        .run(&NoProgress)
        .unwrap_err();
    assert!(err.to_string().contains("model.safetensors"), "{err}");
    assert_no_output(tmp.path(), &["bf16"]);
}

#[test]
fn missing_shard_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let src = scratch_copy("bf16", tmp.path());
    // Turn the single file into an indexed checkpoint whose second shard is missing.
    let index =
        r#"{"metadata": {}, "weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors"}}"#;
    fs::write(src.join("model.safetensors.index.json"), index).unwrap();
    let err = QuantizeBuilder::new(&src, tmp.path().join("out"))
        .run(&NoProgress)
        .unwrap_err();
    assert!(
        err.to_string().contains("model-00002-of-00002.safetensors"),
        "{err}"
    );
    assert_no_output(tmp.path(), &["bf16"]);
}

#[test]
fn existing_dst_needs_force() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("out");
    fs::create_dir(&dst).unwrap();
    fs::write(dst.join("keep.txt"), "mine").unwrap();
    let err = QuantizeBuilder::new(fixture("bf16"), &dst)
        .run(&NoProgress)
        .unwrap_err();
    assert!(err.to_string().contains("--force"), "{err}");
    assert_eq!(fs::read_to_string(dst.join("keep.txt")).unwrap(), "mine");
    // With --force it is replaced as a whole.
    QuantizeBuilder::new(fixture("bf16"), &dst)
        .force(true)
        .run(&NoProgress)
        .unwrap();
    assert!(!dst.join("keep.txt").exists());
    assert!(dst.join("model.safetensors").exists());
    assert_no_output(tmp.path(), &["out"]);
}

#[test]
fn output_inside_source_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let src = scratch_copy("bf16", tmp.path());
    let before = snapshot(&src);
    for dst in [src.clone(), src.join("nested"), tmp.path().to_path_buf()] {
        let err = QuantizeBuilder::new(&src, &dst)
            .force(true)
            .run(&NoProgress)
            .unwrap_err();
        assert!(err.to_string().contains("overlaps the source"), "{err}");
    }
    assert_eq!(snapshot(&src), before);
}

#[test]
fn fused_group_split_names_its_members() {
    let tmp = tempfile::tempdir().unwrap();
    let err = QuantizeBuilder::new(fixture("bf16"), tmp.path().join("out"))
        .targets(vec![r"re:.*self_attn\.(q|k)_proj$".into()])
        .run(&NoProgress)
        .unwrap_err();
    assert!(matches!(err, BuilderError::FusedGroupSplit { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("self_attn.q_proj") && msg.contains("self_attn.v_proj"),
        "{msg}"
    );
    assert_no_output(tmp.path(), &[]);
}

#[test]
fn dimension_not_divisible_by_16_names_the_tensor() {
    // Build a checkpoint whose o_proj has an input dimension of 8.
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir(&src).unwrap();
    let writer = fp4forge_format::ShardWriterBuilder::new()
        .create(
            &src,
            vec![fp4forge_format::TensorSpec::new(
                "m.self_attn.o_proj.weight",
                fp4forge_format::Dtype::BF16,
                [4, 8],
            )],
        )
        .unwrap();
    writer
        .write("m.self_attn.o_proj.weight", &[0u8; 64])
        .unwrap();
    writer.finish().unwrap();
    // A config of no known family: sizes only, no tensor names to check against.
    let config = r#"{"hidden_size": 4, "num_hidden_layers": 1, "num_attention_heads": 1,
        "head_dim": 8, "vocab_size": 8, "intermediate_size": 16}"#;
    fs::write(src.join("config.json"), config).unwrap();
    let err = QuantizeBuilder::new(&src, tmp.path().join("out"))
        .run(&NoProgress)
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("m.self_attn.o_proj.weight") && msg.contains("multiple of 16"),
        "{msg}"
    );
    assert_no_output(tmp.path(), &["src"]);
}

/// A progress sink that aborts the build midway, as an interrupted run would stop it.
struct Interrupt;

impl Progress for Interrupt {
    fn start(&self, _: u64) {}
    fn advance(&self, _: u64) {
        panic!("interrupted");
    }
}

#[test]
fn interrupted_build_leaves_no_dst() {
    let tmp = tempfile::tempdir().unwrap();
    let src = scratch_copy("stock", tmp.path());
    let before = snapshot(&src);
    let dst = tmp.path().join("out");
    let result = std::panic::catch_unwind(|| QuantizeBuilder::new(&src, &dst).run(&Interrupt));
    assert!(result.is_err());
    assert!(!dst.exists());
    assert_eq!(snapshot(&src), before);
    assert_no_output(tmp.path(), &["stock"]);
}

/// Cancels after a few jobs, as Ctrl-C does through the CLI's progress bar.
struct CancelAfter(std::sync::atomic::AtomicUsize);

impl Progress for CancelAfter {
    fn start(&self, _: u64) {}
    fn advance(&self, _: u64) {}
    fn cancelled(&self) -> bool {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst) > 5
    }
}

#[test]
fn cancelled_build_leaves_no_dst() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("out");
    let err = QuantizeBuilder::new(fixture("bf16"), &dst)
        .run(&CancelAfter(Default::default()))
        .unwrap_err();
    assert!(matches!(err, BuilderError::Cancelled), "{err}");
    assert_no_output(tmp.path(), &[]);
}

#[test]
fn partial_directories_of_dead_builds_are_removed_but_not_live_ones() {
    let tmp = tempfile::tempdir().unwrap();
    // A process that has exited (and been reaped): its pid is gone.
    let mut done = std::process::Command::new("true").spawn().unwrap();
    let dead = done.id();
    done.wait().unwrap();
    // A process that is alive for the whole test.
    let mut alive = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let stale = tmp.path().join(format!(".other.fp4forge-partial-{dead}"));
    let live = tmp
        .path()
        .join(format!(".out.fp4forge-partial-{}", alive.id()));
    let unrelated = tmp.path().join(format!(".out.partial-{dead}"));
    for dir in [&stale, &live, &unrelated] {
        fs::create_dir(dir).unwrap();
        fs::write(dir.join("model-00001-of-00002.safetensors"), [0u8; 64]).unwrap();
    }
    let result = QuantizeBuilder::new(fixture("bf16"), tmp.path().join("out")).run(&NoProgress);
    let live_kept = live.is_dir();
    alive.kill().unwrap();
    alive.wait().unwrap();
    result.unwrap();
    assert!(!stale.exists(), "a dead build's partial directory survived");
    assert!(live_kept, "a live build's partial directory was removed");
    assert!(
        unrelated.is_dir(),
        "a directory that is not ours was removed"
    );
}

#[test]
fn targets_that_match_nothing_are_refused_unless_allowed() {
    let tmp = tempfile::tempdir().unwrap();
    let typo = r"re:.*self_attn\.q_prj$";
    let err = QuantizeBuilder::new(fixture("bf16"), tmp.path().join("out"))
        .targets(vec![typo.into(), r"re:.*self_attn\.o_proj$".into()])
        .run(&NoProgress)
        .unwrap_err();
    assert!(matches!(err, BuilderError::NothingSelected { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains(typo) && msg.contains("self_attn.q_proj"),
        "{msg}"
    );
    assert!(msg.contains("--allow-empty"), "{msg}");
    assert_no_output(tmp.path(), &[]);

    // Targets that only reach modules already NVFP4 (the stock routed experts) quantize nothing.
    let err = QuantizeBuilder::new(fixture("stock"), tmp.path().join("out"))
        .targets(vec![r"re:.*mlp\.experts\.\d+\.(gate|up|down)_proj$".into()])
        .run(&NoProgress)
        .unwrap_err();
    assert!(err.to_string().contains("already NVFP4"), "{err}");
    assert_no_output(tmp.path(), &[]);

    // With --allow-empty the copy is written, and it is a faithful one.
    let dst = tmp.path().join("out");
    let report = QuantizeBuilder::new(fixture("bf16"), &dst)
        .targets(vec![typo.into()])
        .allow_empty(true)
        .run(&NoProgress)
        .unwrap();
    assert_eq!(report.summary.modules_quantized, 0);
    let verdict = fp4forge_builder::verify::verify(&fixture("bf16"), &dst).unwrap();
    assert!(verdict.passed(), "{verdict}");
}
