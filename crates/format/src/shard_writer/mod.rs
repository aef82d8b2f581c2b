//! Streaming safetensors writer for a whole (possibly sharded) checkpoint.
//!
//! All output tensors are declared up front, so every shard's header and every tensor's offset
//! are known before any data exists. Data then arrives in any order, from any number of threads,
//! each tensor written once with a positioned write (`pwrite`). Shards are written under a
//! `.partial` name and renamed only by [`ShardWriter::finish`], after every tensor was written
//! and every file fsynced: a crash never leaves a valid-looking but incomplete checkpoint.

mod plan;

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};

use indexmap::IndexMap;
use serde_json::{json, Map, Value};

pub use plan::TensorSpec;
use plan::{Placement, ShardPlan};

use crate::checkpoint::{CheckpointError, INDEX_FILE_NAME};
use crate::fsutil::{sync_dir, write_file_atomic};

/// Default largest shard: 5 GB (10^9 bytes, as transformers' `"5GB"`), counting tensor data.
pub const DEFAULT_MAX_SHARD_BYTES: u64 = 5_000_000_000;

/// Suffix of shard files while they are being written.
const PARTIAL_SUFFIX: &str = ".partial";

const PENDING: u8 = 0;
const WRITING: u8 = 1;
const WRITTEN: u8 = 2;

/// Options of a [`ShardWriter`]; `create` declares the tensors and opens the files.
#[derive(Debug, Clone)]
pub struct ShardWriterBuilder {
    max_shard_bytes: u64,
    metadata: Option<IndexMap<String, String>>,
    always_write_index: bool,
}

impl Default for ShardWriterBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl ShardWriterBuilder {
    /// Defaults: shards of at most [`DEFAULT_MAX_SHARD_BYTES`], header metadata
    /// `{"format": "pt"}` (transformers refuses files whose metadata lacks it), index only
    /// when there is more than one shard.
    pub fn new() -> Self {
        Self {
            max_shard_bytes: DEFAULT_MAX_SHARD_BYTES,
            metadata: Some(IndexMap::from([("format".to_owned(), "pt".to_owned())])),
            always_write_index: false,
        }
    }

    /// Largest data size of a shard in bytes; a single larger tensor gets a shard of its own.
    pub fn max_shard_bytes(mut self, bytes: u64) -> Self {
        self.max_shard_bytes = bytes;
        self
    }

    /// The `__metadata__` map written into every shard header (`None`: no metadata at all).
    pub fn metadata(mut self, metadata: Option<IndexMap<String, String>>) -> Self {
        self.metadata = metadata;
        self
    }

    /// Whether to write `model.safetensors.index.json` even for a single shard.
    pub fn always_write_index(mut self, yes: bool) -> Self {
        self.always_write_index = yes;
        self
    }

    /// Declares `tensors` (their order is the data order), assigns them to shards in that
    /// order, creates the `.partial` shard files in `dir` (which must exist) at their final
    /// size and writes their headers.
    pub fn create(
        self,
        dir: impl AsRef<Path>,
        tensors: impl IntoIterator<Item = TensorSpec>,
    ) -> Result<ShardWriter, CheckpointError> {
        let dir = dir.as_ref().to_path_buf();
        let specs: Vec<TensorSpec> = tensors.into_iter().collect();
        let invalid = |tensor: &str, reason: String| CheckpointError::Write {
            dir: dir.clone(),
            tensor: tensor.to_owned(),
            reason,
        };
        let mut by_name = HashMap::with_capacity(specs.len());
        let mut sizes = Vec::with_capacity(specs.len());
        for (i, spec) in specs.iter().enumerate() {
            if spec.name == "__metadata__" {
                return Err(invalid(&spec.name, "reserved name".into()));
            }
            if by_name.insert(spec.name.clone(), i).is_some() {
                return Err(invalid(&spec.name, "declared twice".into()));
            }
            let len = spec
                .byte_len()
                .filter(|&n| n <= i64::MAX as u64)
                .ok_or_else(|| invalid(&spec.name, format!("shape {:?} overflows", spec.shape)))?;
            sizes.push(len);
        }
        let shard_of = plan::assign(&sizes, self.max_shard_bytes);
        let n_shards = shard_of.last().map_or(1, |&s| s + 1);

        let mut members: Vec<Vec<usize>> = vec![Vec::new(); n_shards];
        for (i, &s) in shard_of.iter().enumerate() {
            members[s].push(i);
        }
        let mut placements = vec![
            Placement {
                shard: 0,
                offset: 0,
                len: 0
            };
            specs.len()
        ];
        let mut plans = Vec::with_capacity(n_shards);
        for (s, idx) in members.iter().enumerate() {
            let listed: Vec<(&TensorSpec, u64)> =
                idx.iter().map(|&i| (&specs[i], sizes[i])).collect();
            let header = plan::header_bytes(self.metadata.as_ref(), &listed);
            let mut offset = header.len() as u64;
            for &i in idx {
                placements[i] = Placement {
                    shard: s,
                    offset,
                    len: sizes[i],
                };
                offset = offset
                    .checked_add(sizes[i])
                    .ok_or_else(|| invalid(&specs[i].name, "shard size overflows".into()))?;
            }
            plans.push(ShardPlan {
                name: plan::shard_file_name(s, n_shards),
                header,
                file_len: offset,
            });
        }

        let mut writer = ShardWriter {
            dir,
            shards: Vec::with_capacity(n_shards),
            slots: Vec::with_capacity(specs.len()),
            by_name,
            write_index: self.always_write_index || n_shards > 1,
            total_size: sizes.iter().sum(),
            finished: false,
        };
        for plan in plans {
            writer.shards.push(open_shard(&writer.dir, plan)?);
        }
        writer.slots = specs
            .into_iter()
            .zip(placements)
            .map(|(spec, at)| Slot {
                spec,
                at,
                state: AtomicU8::new(PENDING),
            })
            .collect();
        Ok(writer)
    }
}

/// A set of output shards being filled. `write` takes `&self`: share it across threads.
///
/// Dropping it without [`ShardWriter::finish`] deletes the partial files.
#[derive(Debug)]
pub struct ShardWriter {
    dir: PathBuf,
    shards: Vec<Shard>,
    slots: Vec<Slot>,
    by_name: HashMap<String, usize>,
    write_index: bool,
    total_size: u64,
    finished: bool,
}

#[derive(Debug)]
struct Shard {
    name: String,
    partial: PathBuf,
    file: File,
}

#[derive(Debug)]
struct Slot {
    spec: TensorSpec,
    at: Placement,
    state: AtomicU8,
}

/// What [`ShardWriter::finish`] produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenCheckpoint {
    /// Shard file names, in order.
    pub shards: Vec<String>,
    /// The index file, when one was written.
    pub index: Option<PathBuf>,
    /// Bytes of tensor data over all shards (the index's `total_size`).
    pub total_size: u64,
}

fn open_shard(dir: &Path, plan: ShardPlan) -> Result<Shard, CheckpointError> {
    let partial = dir.join(format!("{}{PARTIAL_SUFFIX}", plan.name));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&partial)
        .map_err(|e| CheckpointError::io(&partial, e))?;
    file.set_len(plan.file_len)
        .and_then(|()| file.write_all_at(&plan.header, 0))
        .map_err(|e| CheckpointError::io(&partial, e))?;
    Ok(Shard {
        name: plan.name,
        partial,
        file,
    })
}

impl ShardWriter {
    /// Writes the data of tensor `name`: exactly its declared byte length, once.
    /// Safe to call concurrently for different tensors.
    pub fn write(&self, name: &str, data: &[u8]) -> Result<(), CheckpointError> {
        self.write_in_chunks(name, data, usize::MAX, |_| {})
    }

    /// Like [`write`](Self::write), in pieces of at most `chunk` bytes, calling `done` with the
    /// byte range of `data` after each piece is written (e.g. to release the source's pages, so
    /// that copying a huge tensor keeps only one piece resident).
    pub fn write_in_chunks(
        &self,
        name: &str,
        data: &[u8],
        chunk: usize,
        mut done: impl FnMut(std::ops::Range<usize>),
    ) -> Result<(), CheckpointError> {
        let slot = self
            .by_name
            .get(name)
            .map(|&i| &self.slots[i])
            .ok_or_else(|| self.error(name, "not declared".into()))?;
        if data.len() as u64 != slot.at.len {
            return Err(self.error(
                name,
                format!(
                    "{} bytes given, but {:?} of {} takes {}",
                    data.len(),
                    slot.spec.shape,
                    slot.spec.dtype,
                    slot.at.len
                ),
            ));
        }
        if slot
            .state
            .compare_exchange(PENDING, WRITING, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(self.error(name, "written twice".into()));
        }
        let shard = &self.shards[slot.at.shard];
        let mut start = 0;
        while start < data.len() || (start == 0 && data.is_empty()) {
            let end = data.len().min(start.saturating_add(chunk.max(1)));
            if let Err(e) = shard
                .file
                .write_all_at(&data[start..end], slot.at.offset + start as u64)
            {
                slot.state.store(PENDING, Ordering::Release);
                return Err(CheckpointError::io(&shard.partial, e));
            }
            done(start..end);
            if end == data.len() {
                break;
            }
            start = end;
        }
        slot.state.store(WRITTEN, Ordering::Release);
        Ok(())
    }

    /// The output directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The final shard file names, in order.
    pub fn shard_names(&self) -> impl Iterator<Item = &str> + '_ {
        self.shards.iter().map(|s| s.name.as_str())
    }

    /// The final file name of the shard that holds `name`, if declared.
    pub fn shard_of(&self, name: &str) -> Option<&str> {
        let slot = &self.slots[*self.by_name.get(name)?];
        Some(self.shards[slot.at.shard].name.as_str())
    }

    /// The declared tensors, in declaration order.
    pub fn specs(&self) -> impl Iterator<Item = &TensorSpec> + '_ {
        self.slots.iter().map(|s| &s.spec)
    }

    /// Number of declared tensors not written yet.
    pub fn pending(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| s.state.load(Ordering::Acquire) != WRITTEN)
            .count()
    }

    /// Checks every tensor was written, fsyncs the shards, renames them to their final names,
    /// writes the index when there is more than one shard (or when asked; else removes a stale
    /// index from `dir`) and fsyncs the directory.
    pub fn finish(mut self) -> Result<WrittenCheckpoint, CheckpointError> {
        let missing: Vec<&str> = self
            .slots
            .iter()
            .filter(|s| s.state.load(Ordering::Acquire) != WRITTEN)
            .map(|s| s.spec.name.as_str())
            .collect();
        if let Some(first) = missing.first() {
            return Err(self.error(
                first,
                format!("never written ({} tensors missing in all)", missing.len()),
            ));
        }
        for shard in &self.shards {
            shard
                .file
                .sync_all()
                .map_err(|e| CheckpointError::io(&shard.partial, e))?;
        }
        for shard in &self.shards {
            let target = self.dir.join(&shard.name);
            std::fs::rename(&shard.partial, &target)
                .map_err(|e| CheckpointError::io(&target, e))?;
        }
        // From here on the shards exist under their final names: nothing left to clean up.
        self.finished = true;
        let index_path = self.dir.join(INDEX_FILE_NAME);
        let index = if self.write_index {
            write_file_atomic(&index_path, &self.index_json())?;
            Some(index_path)
        } else {
            match std::fs::remove_file(&index_path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(CheckpointError::io(&index_path, e)),
            }
            None
        };
        sync_dir(&self.dir)?;
        Ok(WrittenCheckpoint {
            shards: self.shards.iter().map(|s| s.name.clone()).collect(),
            index,
            total_size: self.total_size,
        })
    }

    /// The index as transformers writes it: sorted keys, two-space indent, final newline.
    fn index_json(&self) -> Vec<u8> {
        let mut names: Vec<(&str, &str)> = self
            .slots
            .iter()
            .map(|s| (s.spec.name.as_str(), self.shards[s.at.shard].name.as_str()))
            .collect();
        names.sort_unstable();
        let weight_map: Map<String, Value> = names
            .into_iter()
            .map(|(t, s)| (t.to_owned(), Value::String(s.to_owned())))
            .collect();
        let index = json!({
            "metadata": { "total_size": self.total_size },
            "weight_map": weight_map,
        });
        let mut out = serde_json::to_vec_pretty(&index).unwrap_or_default();
        out.push(b'\n');
        out
    }

    fn error(&self, tensor: &str, reason: String) -> CheckpointError {
        CheckpointError::Write {
            dir: self.dir.clone(),
            tensor: tensor.to_owned(),
            reason,
        }
    }
}

impl Drop for ShardWriter {
    fn drop(&mut self) {
        if !self.finished {
            for shard in &self.shards {
                let _ = std::fs::remove_file(&shard.partial);
            }
        }
    }
}
