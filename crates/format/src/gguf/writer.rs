//! A minimal GGUF writer, for tests and fixtures: small files built in memory (synthetic models,
//! mutated headers). Version 3, little-endian, tensors in insertion order, each aligned.

use std::path::Path;

use indexmap::IndexMap;

use super::reader::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC};
use super::{GgmlType, GgufError, MetadataArray, MetadataValue};

/// Builds a GGUF file: metadata and tensors (raw ggml bytes), then [`to_bytes`](Self::to_bytes).
#[derive(Debug, Clone, Default)]
pub struct GgufWriter {
    metadata: IndexMap<String, MetadataValue>,
    tensors: Vec<(String, GgmlType, Vec<u64>, Vec<u8>)>,
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_array(out: &mut Vec<u8>, a: &MetadataArray) {
    out.extend_from_slice(&a.element_type().id().to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! each {
        ($v:expr) => {
            $v.iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes()))
        };
    }
    match a {
        MetadataArray::U8(v) => out.extend_from_slice(v),
        MetadataArray::I8(v) => each!(v),
        MetadataArray::U16(v) => each!(v),
        MetadataArray::I16(v) => each!(v),
        MetadataArray::U32(v) => each!(v),
        MetadataArray::I32(v) => each!(v),
        MetadataArray::F32(v) => each!(v),
        MetadataArray::U64(v) => each!(v),
        MetadataArray::I64(v) => each!(v),
        MetadataArray::F64(v) => each!(v),
        MetadataArray::Bool(v) => out.extend(v.iter().map(|&b| u8::from(b))),
        MetadataArray::String(v) => v.iter().for_each(|s| put_str(out, s)),
        MetadataArray::Array(v) => v.iter().for_each(|a| put_array(out, a)),
    }
}

fn put_value(out: &mut Vec<u8>, v: &MetadataValue) {
    match v {
        MetadataValue::U8(x) => out.push(*x),
        MetadataValue::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::Bool(x) => out.push(u8::from(*x)),
        MetadataValue::String(s) => put_str(out, s),
        MetadataValue::Array(a) => put_array(out, a),
        MetadataValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

impl GgufWriter {
    /// An empty file.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets metadata `key` (replacing an earlier value, keeping its position).
    pub fn metadata(
        &mut self,
        key: impl Into<String>,
        value: impl Into<MetadataValue>,
    ) -> &mut Self {
        self.metadata.insert(key.into(), value.into());
        self
    }

    /// Adds a tensor with ggml dimensions `dims` (**innermost first**) and its raw ggml bytes.
    /// Refuses a byte length that does not match the dimensions and type, or a repeated name.
    pub fn tensor(
        &mut self,
        name: impl Into<String>,
        ty: GgmlType,
        dims: &[u64],
        data: Vec<u8>,
    ) -> Result<&mut Self, GgufError> {
        let name = name.into();
        let bad = |reason: String| GgufError::Tensor {
            path: "<GgufWriter>".into(),
            tensor: name.clone(),
            reason,
        };
        let expected = dims
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .and_then(|n| ty.byte_len(n));
        if expected != Some(data.len() as u64) {
            return Err(bad(format!(
                "{} bytes do not hold {dims:?} of {ty} ({expected:?} expected)",
                data.len()
            )));
        }
        if self.tensors.iter().any(|t| t.0 == name) {
            return Err(bad("added twice".into()));
        }
        self.tensors.push((name, ty, dims.to_vec(), data));
        Ok(self)
    }

    fn alignment(&self) -> u64 {
        match self.metadata.get(ALIGNMENT_KEY) {
            Some(MetadataValue::U32(a)) if a.is_power_of_two() => u64::from(*a),
            _ => DEFAULT_ALIGNMENT,
        }
    }

    /// The complete file.
    pub fn to_bytes(&self) -> Vec<u8> {
        let align = self.alignment();
        let pad = |out: &mut Vec<u8>| {
            while !(out.len() as u64).is_multiple_of(align) {
                out.push(0);
            }
        };
        let mut out = Vec::new();
        out.extend_from_slice(&GGUF_MAGIC);
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_str(&mut out, k);
            out.extend_from_slice(&v.value_type().id().to_le_bytes());
            put_value(&mut out, v);
        }
        let mut offset = 0u64;
        for (name, ty, dims, data) in &self.tensors {
            put_str(&mut out, name);
            out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            dims.iter()
                .for_each(|d| out.extend_from_slice(&d.to_le_bytes()));
            out.extend_from_slice(&ty.id().to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offset = (offset + data.len() as u64).div_ceil(align) * align;
        }
        pad(&mut out);
        for (_, _, _, data) in &self.tensors {
            out.extend_from_slice(data);
            pad(&mut out);
        }
        out
    }

    /// Writes the file to `path`.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<(), GgufError> {
        let path = path.as_ref();
        std::fs::write(path, self.to_bytes()).map_err(|source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        })
    }
}
