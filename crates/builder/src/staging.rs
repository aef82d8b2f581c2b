//! Atomic output directories: everything is written into a hidden sibling directory that is
//! renamed onto the destination only when complete. A failed or interrupted build leaves no
//! destination behind (and, when it fails normally, no staging directory either). A build killed
//! outright (`kill -9`, power loss) cannot clean up: its `.DST.fp4forge-partial-PID` directory is
//! removed by the next build into the same parent directory once process PID is gone.

use std::fs;
use std::path::{Path, PathBuf};

use crate::BuilderError;

/// A staging directory for one output; removed on drop unless [`commit`](Self::commit)ted.
#[derive(Debug)]
pub struct StagingDir {
    staging: PathBuf,
    dst: PathBuf,
    committed: bool,
}

fn output_error(path: &Path, reason: impl Into<String>) -> BuilderError {
    BuilderError::Output {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// `path` made absolute and normalised as far as it exists (the last components may not exist).
fn absolute(path: &Path) -> PathBuf {
    let mut existing = path.to_path_buf();
    let mut rest = Vec::new();
    while !existing.exists() {
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                existing = if parent.as_os_str().is_empty() {
                    PathBuf::from(".")
                } else {
                    parent.to_path_buf()
                };
            }
            _ => break,
        }
    }
    let mut out = fs::canonicalize(&existing).unwrap_or(existing);
    out.extend(rest.into_iter().rev());
    out
}

/// The marker between a staging directory's destination name and its owner's process id.
const PARTIAL_MARKER: &str = ".fp4forge-partial-";

/// The process id a staging directory name (`.NAME.fp4forge-partial-PID`) belongs to.
fn partial_owner(name: &str) -> Option<u32> {
    let (head, pid) = name.strip_prefix('.')?.rsplit_once(PARTIAL_MARKER)?;
    if head.is_empty() || pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    pid.parse().ok()
}

/// Whether process `pid` is certainly gone: no `/proc/PID`, or a zombie (exited, not yet
/// reaped). Where there is no `/proc` nothing can be known, and the answer is no (a live build's
/// directory must never be removed).
fn process_gone(pid: u32) -> bool {
    let proc = Path::new("/proc");
    if !proc.join("self").exists() {
        return false;
    }
    match fs::read_to_string(proc.join(pid.to_string()).join("stat")) {
        // `PID (COMM) STATE ...`; COMM may hold spaces and parentheses, STATE follows the last `)`.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
        Err(_) => !proc.join(pid.to_string()).exists(),
    }
}

/// Removes the staging directories in `parent` of builds whose process is gone (killed before
/// they could clean up). Best effort: one that cannot be removed is left for a later run.
fn remove_stale_partials(parent: &Path) {
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(partial_owner) else {
            continue;
        };
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if is_dir && pid != std::process::id() && process_gone(pid) {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

impl StagingDir {
    /// Like [`create`](Self::create) for an output built from `src`; also refuses when `dst`
    /// and `src` are the same directory or one contains the other (a build must never write
    /// into, or delete, its source).
    pub fn create_from(src: &Path, dst: &Path, force: bool) -> Result<Self, BuilderError> {
        let (src_abs, dst_abs) = (absolute(src), absolute(dst));
        if src_abs.starts_with(&dst_abs) || dst_abs.starts_with(&src_abs) {
            return Err(output_error(
                dst,
                format!(
                    "output overlaps the source {} (refusing to write into or replace it)",
                    src.display()
                ),
            ));
        }
        Self::create(dst, force)
    }

    /// Prepares a staging directory for `dst` (creating `dst`'s parent if needed). Refuses when
    /// `dst` exists and `force` is false.
    pub fn create(dst: &Path, force: bool) -> Result<Self, BuilderError> {
        let dst_abs = absolute(dst);
        if fs::symlink_metadata(dst).is_ok() && !force {
            return Err(output_error(
                dst,
                "already exists (pass --force to replace it)",
            ));
        }
        let name = dst
            .file_name()
            .ok_or_else(|| output_error(dst, "has no directory name"))?
            .to_string_lossy()
            .into_owned();
        let parent = dst_abs
            .parent()
            .ok_or_else(|| output_error(dst, "has no parent directory"))?
            .to_path_buf();
        fs::create_dir_all(&parent).map_err(|e| output_error(&parent, e.to_string()))?;
        remove_stale_partials(&parent);
        let staging = parent.join(format!(".{name}{PARTIAL_MARKER}{}", std::process::id()));
        if staging.exists() {
            fs::remove_dir_all(&staging).map_err(|e| output_error(&staging, e.to_string()))?;
        }
        fs::create_dir(&staging).map_err(|e| output_error(&staging, e.to_string()))?;
        Ok(Self {
            staging,
            dst: dst.to_path_buf(),
            committed: false,
        })
    }

    /// The directory to write into.
    pub fn path(&self) -> &Path {
        &self.staging
    }

    /// Moves the finished output onto the destination (replacing an existing one, which is first
    /// moved aside so that the destination is never half old, half new).
    pub fn commit(mut self) -> Result<PathBuf, BuilderError> {
        if let Ok(dir) = fs::File::open(&self.staging) {
            let _ = dir.sync_all();
        }
        let mut aside = None;
        if fs::symlink_metadata(&self.dst).is_ok() {
            let old = self.staging.with_extension("old");
            fs::rename(&self.dst, &old).map_err(|e| output_error(&self.dst, e.to_string()))?;
            aside = Some(old);
        }
        if let Err(e) = fs::rename(&self.staging, &self.dst) {
            if let Some(old) = &aside {
                let _ = fs::rename(old, &self.dst);
            }
            return Err(output_error(&self.dst, e.to_string()));
        }
        self.committed = true;
        if let Some(old) = aside {
            let removed = if fs::symlink_metadata(&old).is_ok_and(|m| m.is_dir()) {
                fs::remove_dir_all(&old)
            } else {
                fs::remove_file(&old)
            };
            removed.map_err(|e| output_error(&old, e.to_string()))?;
        }
        if let Some(parent) = self.dst.parent().and_then(|p| fs::File::open(p).ok()) {
            let _ = parent.sync_all();
        }
        Ok(self.dst.clone())
    }
}

impl Drop for StagingDir {
    fn drop(&mut self) {
        if !self.committed {
            let _ = fs::remove_dir_all(&self.staging);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn liveness_of_processes() {
        assert!(!process_gone(std::process::id()));
        // An exited child not yet reaped is a zombie: gone.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let gone = (0..100).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(50));
            process_gone(pid)
        });
        assert!(gone, "an exited, unreaped child counts as alive");
        child.wait().unwrap();
        assert!(process_gone(pid));
    }

    #[test]
    fn partial_names_are_parsed_strictly() {
        assert_eq!(partial_owner(".out.fp4forge-partial-123"), Some(123));
        assert_eq!(partial_owner(".a.b.fp4forge-partial-7"), Some(7));
        for name in [
            "out.fp4forge-partial-123",
            ".fp4forge-partial-123",
            ".out.fp4forge-partial-",
            ".out.fp4forge-partial-12x",
            ".out.fp4forge-partial-99999999999",
        ] {
            assert_eq!(partial_owner(name), None, "{name}");
        }
    }
}
