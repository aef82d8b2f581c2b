//! One `.safetensors` file, memory-mapped (or read into memory), its header validated on open.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use indexmap::IndexMap;
use memmap2::Mmap;

use super::{CheckpointError, SafetensorsHeader, TensorInfo};

/// How a file's bytes are held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LoadFormat {
    /// Memory-mapped (the default): nothing is copied and pages stay in the page cache, but the
    /// file must not be truncated or rewritten while it is open (a SIGBUS on the next read).
    #[default]
    Mmap,
    /// Read into memory once: the process holds its own copy (the file's size in RAM), so a
    /// file changed or truncated afterwards cannot affect it.
    Copy,
}

/// A file's bytes: a read-only map or an owned copy.
#[derive(Debug)]
enum Storage {
    Mmap(Mmap),
    Heap(Vec<u8>),
}

impl std::ops::Deref for Storage {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Storage::Mmap(m) => m,
            Storage::Heap(v) => v,
        }
    }
}

/// A safetensors file whose header has been validated, memory-mapped or read into memory
/// ([`LoadFormat`]).
///
/// Tensor bytes are borrowed straight from the map or the copy. A mapped file must not be
/// truncated or rewritten by another process while it is open (that would be undefined
/// behaviour for any memory map; in practice a SIGBUS); [`LoadFormat::Copy`] lifts that.
#[derive(Debug)]
pub struct SafetensorsFile {
    path: PathBuf,
    map: Storage,
    header: SafetensorsHeader,
    by_name: HashMap<String, usize>,
}

impl SafetensorsFile {
    /// Opens and maps `path`, then parses and validates its header
    /// (see [`SafetensorsHeader::parse`]).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, CheckpointError> {
        Self::open_with(path, LoadFormat::Mmap)
    }

    /// Opens `path` holding its bytes as `format` says, then parses and validates its header.
    pub fn open_with(path: impl AsRef<Path>, format: LoadFormat) -> Result<Self, CheckpointError> {
        let path = path.as_ref().to_path_buf();
        let map = match format {
            LoadFormat::Mmap => {
                let file = File::open(&path).map_err(|e| CheckpointError::io(&path, e))?;
                // SAFETY: the map is read-only and lives no longer than `self`; the type's
                // contract (documented above) is that nobody truncates or rewrites the file
                // while it is open.
                Storage::Mmap(
                    unsafe { Mmap::map(&file) }.map_err(|e| CheckpointError::io(&path, e))?,
                )
            }
            LoadFormat::Copy => {
                Storage::Heap(std::fs::read(&path).map_err(|e| CheckpointError::io(&path, e))?)
            }
        };
        let header = SafetensorsHeader::parse(&path, &map)?;
        let by_name = header.name_index();
        Ok(Self {
            path,
            map,
            header,
            by_name,
        })
    }

    /// The path the file was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file name (last path component), lossily as UTF-8.
    pub fn file_name(&self) -> String {
        self.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// The validated header.
    pub fn header(&self) -> &SafetensorsHeader {
        &self.header
    }

    /// The header's `__metadata__` map; `None` when the file has none.
    pub fn metadata(&self) -> Option<&IndexMap<String, String>> {
        self.header.metadata.as_ref()
    }

    /// All tensors, in file (data offset) order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.header.tensors
    }

    /// Tensor names, in file (data offset) order.
    pub fn names(&self) -> impl Iterator<Item = &str> + '_ {
        self.header.tensors.iter().map(|t| t.name.as_str())
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.header.tensors.len()
    }

    /// Whether the file holds no tensor.
    pub fn is_empty(&self) -> bool {
        self.header.tensors.is_empty()
    }

    /// Whether a tensor named `name` exists.
    pub fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// The header entry of `name`, if present.
    pub fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.header.tensors[i])
    }

    /// The raw little-endian bytes of `name`, borrowed from the map.
    pub fn bytes(&self, name: &str) -> Result<&[u8], CheckpointError> {
        let &i = self
            .by_name
            .get(name)
            .ok_or_else(|| CheckpointError::MissingTensor {
                path: self.path.clone(),
                tensor: name.to_owned(),
            })?;
        Ok(self.bytes_at(i))
    }

    /// The bytes of the `i`-th tensor in file order (`i < len()`; its range was validated
    /// against the file size when the header was parsed).
    pub(crate) fn bytes_at(&self, i: usize) -> &[u8] {
        let range = &self.header.tensors[i].data_offsets;
        let start = self.header.data_start();
        &self.map[start + range.start..start + range.end]
    }

    /// Drops the pages of tensor `i` from this process's resident set (they are re-read from the
    /// file if touched again). Streaming readers call this after each tensor so that resident
    /// memory stays bounded by the tensors in flight, not by the checkpoint.
    pub(crate) fn release_at(&self, i: usize) {
        let len = self.header.tensors[i].data_offsets.len();
        self.release_range_at(i, 0..len);
    }

    /// Like [`release_at`](Self::release_at) for the byte range `part` of tensor `i`'s data.
    pub(crate) fn release_range_at(&self, i: usize, part: std::ops::Range<usize>) {
        // The kernel maps pages around a faulting one ("fault-around", 64 KiB by default), so
        // reading a tensor also maps the tail of the previous one and the head of the next:
        // release that margin too, or ~1 window per tensor stays resident. Dropping a page
        // another reader still uses is harmless (it is faulted in again from the file).
        const MARGIN: usize = 64 << 10;
        const PAGE: usize = 4096;
        let range = &self.header.tensors[i].data_offsets;
        let base = self.header.data_start() + range.start;
        let begin = (base + part.start).saturating_sub(MARGIN) / PAGE * PAGE;
        let end = (base + part.end.min(range.len()) + MARGIN).min(self.map.len());
        let Storage::Mmap(map) = &self.map else {
            return; // an owned copy has no page cache to release
        };
        if end > begin {
            // SAFETY: the map is a read-only shared file mapping; MADV_DONTNEED only drops cached
            // pages, which the kernel re-reads from the unchanged file on the next access.
            // Failure is harmless (memory just stays resident), so the result is ignored.
            let _ = unsafe {
                map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, begin, end - begin)
            };
        }
    }
}
