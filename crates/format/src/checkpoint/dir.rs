//! A checkpoint directory: one `model.safetensors`, or an index plus shards, plus the small
//! files (tokenizer, chat template, ...) that travel with the weights.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::{
    CheckpointError, LoadFormat, SafetensorsFile, ShardIndex, TensorInfo, INDEX_FILE_NAME,
    SINGLE_FILE_NAME,
};
use crate::config::ModelConfig;

/// The model configuration file, which the builder rewrites rather than copies.
pub const CONFIG_FILE_NAME: &str = "config.json";

/// Suffixes of weight files in other formats: never copied next to converted weights.
const FOREIGN_WEIGHT_SUFFIXES: [&str; 9] = [
    ".safetensors",
    ".safetensors.index.json",
    ".bin",
    ".bin.index.json",
    ".pt",
    ".pth",
    ".ckpt",
    ".gguf",
    ".msgpack",
];

/// A validated checkpoint directory with all its shards mapped.
///
/// Opening checks that every shard named by the index exists, that every tensor the index
/// names is in the shard it names, that every tensor of every shard is in the index (and in that
/// shard), and that no tensor name occurs twice.
#[derive(Debug)]
pub struct Checkpoint {
    dir: PathBuf,
    index: Option<ShardIndex>,
    shards: Vec<SafetensorsFile>,
    /// (shard, tensor-in-shard) for every tensor, in iteration order.
    order: Vec<(usize, usize)>,
    by_name: HashMap<String, usize>,
}

/// One tensor of a [`Checkpoint`]: its header entry and the shard that holds it.
#[derive(Debug, Clone, Copy)]
pub struct TensorEntry<'a> {
    /// The shard that holds the tensor.
    pub shard: &'a SafetensorsFile,
    /// The tensor's header entry (name, dtype, shape, byte range).
    pub info: &'a TensorInfo,
    index_in_shard: usize,
}

impl<'a> TensorEntry<'a> {
    /// The tensor's name.
    pub fn name(&self) -> &'a str {
        &self.info.name
    }

    /// The tensor's raw bytes, borrowed from the shard's memory map.
    pub fn bytes(&self) -> &'a [u8] {
        self.shard.bytes_at(self.index_in_shard)
    }

    /// Lets the OS drop this tensor's pages from memory (call when done with its bytes; reading
    /// them again still works, from disk).
    pub fn release(&self) {
        self.shard.release_at(self.index_in_shard)
    }

    /// Like [`release`](Self::release) for the byte range `part` of this tensor's data.
    pub fn release_range(&self, part: std::ops::Range<usize>) {
        self.shard.release_range_at(self.index_in_shard, part)
    }
}

impl Checkpoint {
    /// Opens the checkpoint in `dir`: `model.safetensors.index.json` and its shards when the
    /// index exists, else `model.safetensors`, else the directory's only `*.safetensors` file.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, CheckpointError> {
        Self::open_with(dir, LoadFormat::Mmap)
    }

    /// [`Checkpoint::open`] with the shards' bytes held as `format` says.
    pub fn open_with(dir: impl AsRef<Path>, format: LoadFormat) -> Result<Self, CheckpointError> {
        let dir = dir.as_ref().to_path_buf();
        let index_path = dir.join(INDEX_FILE_NAME);
        if index_path.is_file() {
            return Self::open_indexed(dir, index_path, format);
        }
        let single = dir.join(SINGLE_FILE_NAME);
        let single = if single.is_file() {
            single
        } else {
            let mut found = safetensors_files(&dir)?;
            match found.len() {
                1 => found.remove(0),
                0 => {
                    return Err(CheckpointError::Layout {
                        dir,
                        reason: format!(
                            "no {INDEX_FILE_NAME}, {SINGLE_FILE_NAME} or other *.safetensors file"
                        ),
                    })
                }
                n => {
                    return Err(CheckpointError::Layout {
                        dir,
                        reason: format!(
                            "{n} *.safetensors files but no {INDEX_FILE_NAME} saying how they fit"
                        ),
                    })
                }
            }
        };
        let shard = SafetensorsFile::open_with(&single, format)?;
        let order = (0..shard.len()).map(|t| (0, t)).collect();
        let mut ckpt = Self {
            dir,
            index: None,
            shards: vec![shard],
            order,
            by_name: HashMap::new(),
        };
        ckpt.build_name_map(None)?;
        Ok(ckpt)
    }

    fn open_indexed(
        dir: PathBuf,
        index_path: PathBuf,
        format: LoadFormat,
    ) -> Result<Self, CheckpointError> {
        let index = ShardIndex::from_path(&index_path)?;
        index.check_shard_names(&index_path)?;
        let mut names: Vec<&str> = index.shard_names();
        names.sort_unstable();
        let mut shards = Vec::with_capacity(names.len());
        for name in &names {
            let path = dir.join(name);
            if !path.is_file() {
                return Err(CheckpointError::MissingShard {
                    index: index_path,
                    shard: (*name).to_owned(),
                });
            }
            shards.push(SafetensorsFile::open_with(&path, format)?);
        }
        let order = shards
            .iter()
            .enumerate()
            .flat_map(|(s, f)| (0..f.len()).map(move |t| (s, t)))
            .collect();
        let mut ckpt = Self {
            dir,
            index: None,
            shards,
            order,
            by_name: HashMap::new(),
        };
        ckpt.build_name_map(Some(&index_path))?;
        ckpt.check_index(&index, &index_path)?;
        ckpt.index = Some(index);
        Ok(ckpt)
    }

    /// Fills `by_name`, rejecting a name held by two shards.
    fn build_name_map(&mut self, index_path: Option<&Path>) -> Result<(), CheckpointError> {
        let mut by_name = HashMap::with_capacity(self.order.len());
        for (pos, &(s, t)) in self.order.iter().enumerate() {
            let name = &self.shards[s].tensors()[t].name;
            if let Some(prev) = by_name.insert(name.clone(), pos) {
                let first = &self.shards[self.order[prev].0];
                return Err(CheckpointError::IndexMismatch {
                    index: index_path.map_or_else(|| self.dir.clone(), Path::to_path_buf),
                    tensor: name.clone(),
                    shard: self.shards[s].file_name(),
                    reason: format!("also present in shard `{}`", first.file_name()),
                });
            }
        }
        self.by_name = by_name;
        Ok(())
    }

    /// Checks that the index's weight_map and the shards' contents agree exactly.
    fn check_index(&self, index: &ShardIndex, index_path: &Path) -> Result<(), CheckpointError> {
        let mismatch =
            |tensor: &str, shard: String, reason: String| CheckpointError::IndexMismatch {
                index: index_path.to_path_buf(),
                tensor: tensor.to_owned(),
                shard,
                reason,
            };
        for (tensor, shard) in &index.weight_map {
            match self.get(tensor) {
                None => {
                    return Err(mismatch(
                        tensor,
                        shard.clone(),
                        "the index puts the tensor in this shard, which does not contain it".into(),
                    ))
                }
                Some(e) if e.shard.file_name() != *shard => {
                    return Err(mismatch(
                        tensor,
                        shard.clone(),
                        format!(
                            "the index puts the tensor in this shard, but it is in `{}`",
                            e.shard.file_name()
                        ),
                    ))
                }
                Some(_) => {}
            }
        }
        if let Some(e) = self
            .tensors()
            .find(|e| !index.weight_map.contains_key(e.name()))
        {
            return Err(mismatch(
                e.name(),
                e.shard.file_name(),
                "the shard holds a tensor the index does not list".into(),
            ));
        }
        Ok(())
    }

    /// The checkpoint directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The path of `config.json` in the directory (which may not exist).
    pub fn config_path(&self) -> PathBuf {
        self.dir.join(CONFIG_FILE_NAME)
    }

    /// Reads and parses the directory's `config.json`.
    pub fn config(&self) -> Result<ModelConfig, CheckpointError> {
        ModelConfig::from_path(self.config_path())
    }

    /// The shard index, for a sharded checkpoint.
    pub fn index(&self) -> Option<&ShardIndex> {
        self.index.as_ref()
    }

    /// The safetensors files, sorted by file name.
    pub fn shards(&self) -> &[SafetensorsFile] {
        &self.shards
    }

    /// Number of tensors over all shards.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether the checkpoint holds no tensor.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Every tensor: shards in file-name order, each in file (data offset) order, so that
    /// iterating reads the disk sequentially.
    pub fn tensors(&self) -> impl Iterator<Item = TensorEntry<'_>> + '_ {
        self.order.iter().map(move |&(s, t)| self.entry(s, t))
    }

    /// The tensor named `name`, if present.
    pub fn get(&self, name: &str) -> Option<TensorEntry<'_>> {
        let &(s, t) = self.order.get(*self.by_name.get(name)?)?;
        Some(self.entry(s, t))
    }

    /// Whether a tensor named `name` exists.
    pub fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// The raw bytes of `name` (zero copy).
    pub fn bytes(&self, name: &str) -> Result<&[u8], CheckpointError> {
        self.get(name)
            .map(|e| e.bytes())
            .ok_or_else(|| CheckpointError::MissingTensor {
                path: self.dir.clone(),
                tensor: name.to_owned(),
            })
    }

    /// The files to copy unchanged into a converted checkpoint, as file names sorted: every
    /// regular file (or link to one) at the top of the directory except `config.json`, hidden
    /// files, and weight files (`*.safetensors`, their index, `*.bin`, `*.pt`, `*.pth`, `*.ckpt`,
    /// `*.gguf`, `*.msgpack` and their indexes). Subdirectories are not listed.
    pub fn other_files(&self) -> Result<Vec<String>, CheckpointError> {
        let mut out = Vec::new();
        for (name, path) in dir_files(&self.dir)? {
            let weights = FOREIGN_WEIGHT_SUFFIXES.iter().any(|s| name.ends_with(s));
            if name != CONFIG_FILE_NAME && !name.starts_with('.') && !weights && path.is_file() {
                out.push(name);
            }
        }
        out.sort();
        Ok(out)
    }

    fn entry(&self, s: usize, t: usize) -> TensorEntry<'_> {
        let shard = &self.shards[s];
        TensorEntry {
            shard,
            info: &shard.tensors()[t],
            index_in_shard: t,
        }
    }
}

/// The `*.safetensors` regular files at the top of `dir`, sorted.
fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>, CheckpointError> {
    let mut out: Vec<PathBuf> = dir_files(dir)?
        .into_iter()
        .filter(|(name, path)| name.ends_with(".safetensors") && path.is_file())
        .map(|(_, path)| path)
        .collect();
    out.sort();
    Ok(out)
}

/// (file name, path) of every UTF-8-named entry at the top of `dir`.
fn dir_files(dir: &Path) -> Result<Vec<(String, PathBuf)>, CheckpointError> {
    let read = std::fs::read_dir(dir).map_err(|e| CheckpointError::io(dir, e))?;
    let mut out = Vec::new();
    for entry in read {
        let entry = entry.map_err(|e| CheckpointError::io(dir, e))?;
        if let Ok(name) = entry.file_name().into_string() {
            out.push((name, entry.path()));
        }
    }
    Ok(out)
}
