//! Parsing a GGUF file: fixed header, metadata key/values, tensor infos, alignment and data
//! offset; then the memory-mapped tensor data. Every count, length and offset read from the file
//! is checked against the bytes that are really there before anything is allocated or indexed,
//! so a corrupt or hostile file gives a [`GgufError`], never a panic or a huge allocation.

use std::collections::HashMap;
use std::fs::File;
use std::ops::Deref;
use std::path::{Path, PathBuf};

use indexmap::IndexMap;
use memmap2::Mmap;

use super::quants::dequantize;
use super::{GgmlType, GgufError, MetadataArray, MetadataValue, ValueType};

/// The four bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Tensor data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The metadata key that overrides the alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// Most dimensions a ggml tensor has (`GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;
/// Deepest nesting of metadata arrays accepted.
const MAX_ARRAY_DEPTH: usize = 8;

/// One tensor as described in the header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// The tensor's name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Element type.
    pub ggml_type: GgmlType,
    /// ggml dimensions `ne`, **innermost first** (`ne[0]` is the contiguous row length, i.e. a
    /// Linear's `in`); numpy/safetensors order is the reverse, see [`TensorInfo::shape`].
    pub dims: Vec<u64>,
    /// Offset of the data from the start of the data section (a multiple of the alignment).
    pub offset: u64,
}

impl TensorInfo {
    /// Dimensions outermost first (numpy, safetensors and PyTorch order): `[out, in]` for a
    /// Linear weight stored as ggml `ne = [in, out]`.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }

    /// Number of elements (validated not to overflow when the header was parsed).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Bytes of data.
    pub fn n_bytes(&self) -> u64 {
        self.ggml_type.byte_len(self.n_elements()).unwrap_or(0)
    }
}

/// Everything before the tensor data: version, metadata, tensor infos, where the data starts.
#[derive(Debug, Clone)]
pub struct GgufHeader {
    path: PathBuf,
    version: u32,
    metadata: IndexMap<String, MetadataValue>,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
}

/// A bounds-checked little-endian reader over the file's bytes.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    path: &'a Path,
}

/// Where a parse error belongs: the fixed header, or a metadata key.
#[derive(Clone, Copy)]
enum Ctx<'k> {
    Header,
    Key(&'k str),
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn err(&self, ctx: Ctx<'_>, reason: impl Into<String>) -> GgufError {
        match ctx {
            Ctx::Header => GgufError::Header {
                path: self.path.to_path_buf(),
                offset: self.pos as u64,
                reason: reason.into(),
            },
            Ctx::Key(key) => GgufError::Metadata {
                path: self.path.to_path_buf(),
                key: key.to_owned(),
                reason: format!("at byte {}: {}", self.pos, reason.into()),
            },
        }
    }

    fn take(&mut self, n: usize, ctx: Ctx<'_>, what: &str) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(self.err(
                ctx,
                format!(
                    "truncated: {what} needs {n} bytes, {} left in the file",
                    self.remaining()
                ),
            ));
        }
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, ctx: Ctx<'_>, what: &str) -> Result<[u8; N], GgufError> {
        let b = self.take(N, ctx, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(b);
        Ok(out)
    }

    fn u32(&mut self, ctx: Ctx<'_>, what: &str) -> Result<u32, GgufError> {
        self.array(ctx, what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, ctx: Ctx<'_>, what: &str) -> Result<u64, GgufError> {
        self.array(ctx, what).map(u64::from_le_bytes)
    }

    /// A `u64` count of items of at least `min_item` bytes each, checked against the bytes left.
    fn count(&mut self, min_item: usize, ctx: Ctx<'_>, what: &str) -> Result<usize, GgufError> {
        let n = self.u64(ctx, what)?;
        let fits = (self.remaining() / min_item.max(1)) as u64;
        if n > fits {
            return Err(self.err(
                ctx,
                format!(
                    "{what} {n} cannot fit in the {} bytes left in the file",
                    self.remaining()
                ),
            ));
        }
        Ok(n as usize)
    }

    fn string(&mut self, ctx: Ctx<'_>, what: &str) -> Result<String, GgufError> {
        let len = self.count(1, ctx, &format!("{what} length"))?;
        let start = self.pos;
        let b = self.take(len, ctx, what)?;
        String::from_utf8(b.to_vec()).map_err(|e| {
            let mut err = self.err(ctx, format!("{what} is not valid UTF-8: {e}"));
            if let GgufError::Header { offset, .. } = &mut err {
                *offset = start as u64;
            }
            err
        })
    }

    fn value_type(&mut self, ctx: Ctx<'_>) -> Result<ValueType, GgufError> {
        let id = self.u32(ctx, "value type")?;
        ValueType::from_id(id).ok_or_else(|| {
            self.pos -= 4;
            self.err(ctx, format!("unknown value type id {id}"))
        })
    }

    fn value(
        &mut self,
        ty: ValueType,
        key: &str,
        depth: usize,
    ) -> Result<MetadataValue, GgufError> {
        let ctx = Ctx::Key(key);
        Ok(match ty {
            ValueType::U8 => MetadataValue::U8(self.array::<1>(ctx, "u8")?[0]),
            ValueType::I8 => MetadataValue::I8(self.array::<1>(ctx, "i8")?[0] as i8),
            ValueType::U16 => MetadataValue::U16(u16::from_le_bytes(self.array(ctx, "u16")?)),
            ValueType::I16 => MetadataValue::I16(i16::from_le_bytes(self.array(ctx, "i16")?)),
            ValueType::U32 => MetadataValue::U32(self.u32(ctx, "u32")?),
            ValueType::I32 => MetadataValue::I32(i32::from_le_bytes(self.array(ctx, "i32")?)),
            ValueType::F32 => MetadataValue::F32(f32::from_le_bytes(self.array(ctx, "f32")?)),
            ValueType::Bool => MetadataValue::Bool(self.bool(ctx)?),
            ValueType::String => MetadataValue::String(self.string(ctx, "string")?),
            ValueType::Array => MetadataValue::Array(self.metadata_array(key, depth + 1)?),
            ValueType::U64 => MetadataValue::U64(self.u64(ctx, "u64")?),
            ValueType::I64 => MetadataValue::I64(i64::from_le_bytes(self.array(ctx, "i64")?)),
            ValueType::F64 => MetadataValue::F64(f64::from_le_bytes(self.array(ctx, "f64")?)),
        })
    }

    fn bool(&mut self, ctx: Ctx<'_>) -> Result<bool, GgufError> {
        match self.array::<1>(ctx, "bool")?[0] {
            0 => Ok(false),
            1 => Ok(true),
            b => {
                self.pos -= 1;
                Err(self.err(ctx, format!("bool byte {b} is neither 0 nor 1")))
            }
        }
    }

    fn metadata_array(&mut self, key: &str, depth: usize) -> Result<MetadataArray, GgufError> {
        let ctx = Ctx::Key(key);
        if depth > MAX_ARRAY_DEPTH {
            return Err(self.err(ctx, format!("arrays nested deeper than {MAX_ARRAY_DEPTH}")));
        }
        let ty = self.value_type(ctx)?;
        // Smallest encoding of one element: strings take at least their 8-byte length, arrays
        // their 4-byte type and 8-byte count.
        let min_item = ty.fixed_size().unwrap_or(match ty {
            ValueType::String => 8,
            _ => 12,
        });
        let n = self.count(min_item, ctx, "array length")?;
        macro_rules! fixed {
            ($variant:ident, $t:ty) => {{
                let b = self.take(n * std::mem::size_of::<$t>(), ctx, "array")?;
                MetadataArray::$variant(
                    b.chunks_exact(std::mem::size_of::<$t>())
                        .map(|c| <$t>::from_le_bytes(c.try_into().unwrap_or_default()))
                        .collect(),
                )
            }};
        }
        Ok(match ty {
            ValueType::U8 => MetadataArray::U8(self.take(n, ctx, "array")?.to_vec()),
            ValueType::I8 => MetadataArray::I8(
                self.take(n, ctx, "array")?
                    .iter()
                    .map(|&b| b as i8)
                    .collect(),
            ),
            ValueType::U16 => fixed!(U16, u16),
            ValueType::I16 => fixed!(I16, i16),
            ValueType::U32 => fixed!(U32, u32),
            ValueType::I32 => fixed!(I32, i32),
            ValueType::F32 => fixed!(F32, f32),
            ValueType::U64 => fixed!(U64, u64),
            ValueType::I64 => fixed!(I64, i64),
            ValueType::F64 => fixed!(F64, f64),
            ValueType::Bool => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.bool(ctx)?);
                }
                MetadataArray::Bool(v)
            }
            ValueType::String => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.string(ctx, "string")?);
                }
                MetadataArray::String(v)
            }
            ValueType::Array => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.metadata_array(key, depth + 1)?);
                }
                MetadataArray::Array(v)
            }
        })
    }
}

impl GgufHeader {
    /// Parses the header of a GGUF file whose complete contents are `bytes` (`path` labels
    /// errors). Checks the magic, the version (2 or 3, little-endian), every metadata value,
    /// every tensor info (known type, at most [`MAX_DIMS`] dimensions, whole blocks, no overflow,
    /// aligned offset, unique name) and that every tensor's data lies inside `bytes`.
    pub fn parse(bytes: &[u8], path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let path = path.as_ref();
        let mut c = Cursor {
            bytes,
            pos: 0,
            path,
        };
        let h = Ctx::Header;
        let magic = c.array::<4>(h, "magic")?;
        if magic != GGUF_MAGIC {
            c.pos = 0;
            return Err(c.err(
                h,
                format!("not a GGUF file (magic {magic:02x?}, expected \"GGUF\")"),
            ));
        }
        let version = c.u32(h, "version")?;
        if version != 2 && version != 3 {
            c.pos -= 4;
            let reason = if version.swap_bytes() == 2 || version.swap_bytes() == 3 {
                "big-endian GGUF is not supported".to_owned()
            } else if version == 1 {
                "GGUF version 1 (32-bit counts) is not supported".to_owned()
            } else {
                format!("unsupported GGUF version {version} (supported: 2, 3)")
            };
            return Err(c.err(h, reason));
        }
        // A tensor info takes at least 8 (name length) + 4 (n_dims) + 4 (type) + 8 (offset)
        // bytes; a key/value at least 8 (key length) + 4 (type) + 1.
        let n_tensors = c.count(24, h, "tensor count")?;
        let n_kv = c.count(13, h, "metadata count")?;

        let mut metadata = IndexMap::with_capacity(n_kv);
        for _ in 0..n_kv {
            let key_at = c.pos;
            let key = c.string(h, "metadata key")?;
            let ty = c.value_type(Ctx::Key(&key))?;
            let value = c.value(ty, &key, 0)?;
            if metadata.insert(key.clone(), value).is_some() {
                c.pos = key_at;
                return Err(c.err(Ctx::Key(&key), "key appears twice"));
            }
        }

        let alignment = match metadata.get(ALIGNMENT_KEY) {
            None => DEFAULT_ALIGNMENT,
            Some(MetadataValue::U32(a)) if a.is_power_of_two() => u64::from(*a),
            Some(v) => {
                return Err(GgufError::Metadata {
                    path: path.to_path_buf(),
                    key: ALIGNMENT_KEY.into(),
                    reason: format!("must be a u32 power of two, found {v:?}"),
                })
            }
        };

        let mut tensors = Vec::with_capacity(n_tensors);
        let mut by_name = HashMap::with_capacity(n_tensors);
        for i in 0..n_tensors {
            let name = c.string(h, &format!("name of tensor {i}"))?;
            let bad = |reason: String| GgufError::Tensor {
                path: path.to_path_buf(),
                tensor: name.clone(),
                reason,
            };
            let n_dims = c.u32(h, "tensor n_dims")? as usize;
            if n_dims > MAX_DIMS {
                return Err(bad(format!("{n_dims} dimensions (at most {MAX_DIMS})")));
            }
            let mut dims = Vec::with_capacity(n_dims);
            for _ in 0..n_dims {
                dims.push(c.u64(h, "tensor dimension")?);
            }
            let type_id = c.u32(h, "tensor type")?;
            let offset = c.u64(h, "tensor offset")?;
            let ggml_type = GgmlType::from_id(type_id)
                .ok_or_else(|| bad(format!("unknown ggml type id {type_id}")))?;
            let n_elements = dims
                .iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(d))
                .filter(|&n| n <= i64::MAX as u64)
                .ok_or_else(|| bad(format!("dimensions {dims:?} overflow")))?;
            let block = ggml_type.block_size() as u64;
            if dims.first().is_some_and(|&d| d % block != 0) {
                return Err(bad(format!(
                    "row length {} is not a multiple of the {ggml_type} block size {block}",
                    dims[0]
                )));
            }
            if ggml_type.byte_len(n_elements).is_none() {
                return Err(bad(format!(
                    "{n_elements} elements of {ggml_type} overflow"
                )));
            }
            if offset % alignment != 0 {
                return Err(bad(format!(
                    "data offset {offset} is not a multiple of the alignment {alignment}"
                )));
            }
            if by_name.insert(name.clone(), i).is_some() {
                return Err(bad("name appears twice".into()));
            }
            tensors.push(TensorInfo {
                name,
                ggml_type,
                dims,
                offset,
            });
        }

        let end_of_infos = c.pos as u64;
        let data_offset = end_of_infos.div_ceil(alignment) * alignment;
        let file_len = bytes.len() as u64;
        for t in &tensors {
            let end = data_offset
                .checked_add(t.offset)
                .and_then(|s| s.checked_add(t.n_bytes()));
            match end {
                Some(end) if end <= file_len => {}
                _ => {
                    return Err(GgufError::Tensor {
                        path: path.to_path_buf(),
                        tensor: t.name.clone(),
                        reason: format!(
                        "data [{} + {}, {} bytes) runs past the end of the file ({file_len} bytes)",
                        data_offset,
                        t.offset,
                        t.n_bytes()
                    ),
                    })
                }
            }
        }
        Ok(Self {
            path: path.to_path_buf(),
            version,
            metadata,
            tensors,
            by_name,
            alignment,
            data_offset,
        })
    }

    /// The file this header was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Data alignment in bytes (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute file offset of the tensor data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// All metadata, in file order.
    pub fn metadata(&self) -> &IndexMap<String, MetadataValue> {
        &self.metadata
    }

    /// All tensor infos, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// The metadata value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&MetadataValue> {
        self.metadata.get(key)
    }

    fn meta_err(&self, key: &str, reason: impl Into<String>) -> GgufError {
        GgufError::Metadata {
            path: self.path.clone(),
            key: key.to_owned(),
            reason: reason.into(),
        }
    }

    fn typed<'s, T>(
        &'s self,
        key: &str,
        want: &str,
        f: impl FnOnce(&'s MetadataValue) -> Option<T>,
    ) -> Result<Option<T>, GgufError> {
        match self.metadata.get(key) {
            None => Ok(None),
            Some(v) => f(v).map(Some).ok_or_else(|| {
                self.meta_err(key, format!("expected {want}, found {:?}", v.value_type()))
            }),
        }
    }

    fn required<T>(&self, key: &str, v: Option<T>) -> Result<T, GgufError> {
        v.ok_or_else(|| self.meta_err(key, "missing"))
    }

    /// `key` as a non-negative integer (any integer type); `None` when absent.
    pub fn u64_opt(&self, key: &str) -> Result<Option<u64>, GgufError> {
        self.typed(key, "a non-negative integer", MetadataValue::as_u64)
    }

    /// `key` as a non-negative integer; missing is an error.
    pub fn u64(&self, key: &str) -> Result<u64, GgufError> {
        let v = self.u64_opt(key)?;
        self.required(key, v)
    }

    /// `key` as a number (any numeric type) widened to `f64`; `None` when absent.
    pub fn f64_opt(&self, key: &str) -> Result<Option<f64>, GgufError> {
        self.typed(key, "a number", MetadataValue::as_f64)
    }

    /// `key` as a boolean; `None` when absent.
    pub fn bool_opt(&self, key: &str) -> Result<Option<bool>, GgufError> {
        self.typed(key, "a bool", MetadataValue::as_bool)
    }

    /// `key` as a string; `None` when absent.
    pub fn str_opt(&self, key: &str) -> Result<Option<&str>, GgufError> {
        self.typed(key, "a string", MetadataValue::as_str)
    }

    /// `key` as a string; missing is an error.
    pub fn str(&self, key: &str) -> Result<&str, GgufError> {
        let v = self.str_opt(key)?;
        self.required(key, v)
    }

    /// `key` as an array of strings; `None` when absent.
    pub fn strings_opt(&self, key: &str) -> Result<Option<&[String]>, GgufError> {
        self.typed(key, "an array of strings", |v| v.as_array()?.as_strings())
    }

    /// `key` as an array of integers (any width) widened to `i64`; `None` when absent.
    pub fn i64s_opt(&self, key: &str) -> Result<Option<Vec<i64>>, GgufError> {
        self.typed(key, "an array of integers", |v| v.as_array()?.to_i64s())
    }
}

/// The bytes of a GGUF file: memory-mapped, or owned (for files built in memory).
#[derive(Debug)]
enum Storage {
    Mmap(Mmap),
    Owned(Vec<u8>),
}

impl Deref for Storage {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Storage::Mmap(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// An open GGUF file: its parsed [`GgufHeader`] and its tensor data, memory-mapped.
#[derive(Debug)]
pub struct GgufFile {
    header: GgufHeader,
    data: Storage,
}

impl GgufFile {
    /// Opens and memory-maps `path`, then parses and validates its header
    /// ([`GgufHeader::parse`]).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let path = path.as_ref();
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len < 24 {
            return Err(GgufError::Header {
                path: path.to_path_buf(),
                offset: len,
                reason: format!("truncated: {len} bytes cannot hold a GGUF header (24 bytes)"),
            });
        }
        // SAFETY: the map is read-only; like every reader of model files we assume nobody
        // truncates the file while it is open (the safetensors reader makes the same assumption).
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        let header = GgufHeader::parse(&map, path)?;
        Ok(Self {
            header,
            data: Storage::Mmap(map),
        })
    }

    /// A GGUF file held in memory (`label` names it in errors).
    pub fn from_bytes(bytes: Vec<u8>, label: impl AsRef<Path>) -> Result<Self, GgufError> {
        let header = GgufHeader::parse(&bytes, label)?;
        Ok(Self {
            header,
            data: Storage::Owned(bytes),
        })
    }

    /// The parsed header (metadata, tensor infos, typed metadata getters).
    pub fn header(&self) -> &GgufHeader {
        &self.header
    }

    /// The file's path (or label).
    pub fn path(&self) -> &Path {
        &self.header.path
    }

    /// All tensor infos, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.header.tensors
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.header.tensor(name)
    }

    /// The raw bytes of `info`'s data (bounds were checked at open).
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        let start = (self.header.data_offset + info.offset) as usize;
        self.data
            .get(start..start + info.n_bytes() as usize)
            .unwrap_or_default()
    }

    /// `info`'s data dequantized to `f32`, in ggml order (row-major over `shape()`).
    pub fn dequantize(&self, info: &TensorInfo) -> Result<Vec<f32>, GgufError> {
        let mut out = vec![0f32; info.n_elements() as usize];
        self.dequantize_into(info, &mut out)?;
        Ok(out)
    }

    /// Dequantizes `info`'s data into `out` (exactly `n_elements` long).
    pub fn dequantize_into(&self, info: &TensorInfo, out: &mut [f32]) -> Result<(), GgufError> {
        dequantize(info.ggml_type, self.tensor_data(info), out).map_err(|e| GgufError::Tensor {
            path: self.header.path.clone(),
            tensor: info.name.clone(),
            reason: e.to_string(),
        })
    }

    /// The tensor named `name` dequantized to `f32`; an error names a missing tensor.
    pub fn dequantize_named(&self, name: &str) -> Result<Vec<f32>, GgufError> {
        let info = self.tensor(name).ok_or_else(|| GgufError::Tensor {
            path: self.header.path.clone(),
            tensor: name.to_owned(),
            reason: "no such tensor".into(),
        })?;
        self.dequantize(info)
    }
}
