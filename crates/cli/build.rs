//! Records the git commit the binary is built from, for `fp4forge --version`: benchmark reports
//! name the binary's commit from it wherever the binary runs (a GPU machine's copy of the
//! repository may not have the commit's history). `unknown` outside a git checkout.

use std::path::Path;
use std::process::Command;

fn git(root: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(root)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .filter(|s| !s.is_empty())
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let commit = git(&root, &["rev-parse", "--short=7", "HEAD"]);
    println!(
        "cargo:rustc-env=FP4FORGE_GIT_COMMIT={}",
        commit.as_deref().unwrap_or("unknown")
    );
    // Built again when HEAD moves: a checkout (HEAD), a commit (the branch's ref, the index).
    if let Some(dir) = git(&root, &["rev-parse", "--absolute-git-dir"]) {
        let dir = Path::new(&dir);
        let mut watched = vec![dir.join("HEAD"), dir.join("index"), dir.join("packed-refs")];
        if let Some(head_ref) = git(&root, &["symbolic-ref", "-q", "HEAD"]) {
            watched.push(dir.join(head_ref));
        }
        for path in watched.iter().filter(|p| p.exists()) {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
}
