//! Bounds-checked parser for the GGUF header, metadata and tensor infos.
//!
//! Every count and length is checked against the bytes that remain before anything is
//! allocated, and array items are bounded for the whole header ([`MAX_ARRAY_ITEMS`]): a parsed
//! item takes up to 32 bytes for an item of 1 byte in the file, so the file size alone would
//! let a multi-GB file of one `u8` array ask for 32 times its size.

use crate::value::{Value, ValueType};
use crate::{GgufError, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS};
use quarrel_quant::QuantType;

/// Deepest array nesting accepted (GGUF allows nesting; real files use 1 level).
const MAX_NESTING: usize = 8;

/// Array items (all arrays, nested ones too) one header may hold: the largest tokenizers
/// (262,144 tokens with scores and types, or ~300,000 merges) stay far below it, and the
/// parsed values then take at most ~512 MiB whatever the file claims.
pub const MAX_ARRAY_ITEMS: u64 = 1 << 24;

pub(crate) struct RawTensor {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: QuantType,
    pub offset: u64,
}

pub(crate) struct Header {
    pub version: u32,
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<RawTensor>,
    pub alignment: u64,
    /// Offset of the data section from the start of the file.
    pub data_offset: usize,
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Array items still allowed in this header.
    items_left: u64,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() as u64 {
            return Err(GgufError::Truncated { what: what(), offset: self.pos, needed: n, len: self.buf.len() });
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count of items that each take at least `min_size` bytes.
    fn count(&mut self, min_size: usize, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        let n = self.u64(what)?;
        if n.saturating_mul(min_size as u64) > self.remaining() as u64 {
            return Err(GgufError::AbsurdCount { what: what(), count: n, remaining: self.remaining() });
        }
        Ok(n)
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufError> {
        let n = self.count(1, &|| format!("string length of {}", what()))?;
        let bytes = self.take(n, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::BadUtf8 { key: what() })
    }

    fn value(&mut self, ty: ValueType, key: &str, depth: usize) -> Result<Value, GgufError> {
        let what = || format!("value of {key:?}");
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>(&what)?[0]),
            ValueType::I8 => Value::I8(self.array::<1>(&what)?[0] as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(&what)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(&what)?)),
            ValueType::U32 => Value::U32(self.u32(&what)?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(&what)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(&what)?)),
            ValueType::Bool => match self.array::<1>(&what)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => {
                    return Err(GgufError::WrongType { key: key.to_string(), expected: "bool (0 or 1)".into(), found: format!("byte {b}") })
                }
            },
            ValueType::String => Value::String(self.string(&|| key.to_string())?),
            ValueType::U64 => Value::U64(self.u64(&what)?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(&what)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(&what)?)),
            ValueType::Array => {
                if depth >= MAX_NESTING {
                    return Err(GgufError::TooDeep { key: key.to_string(), max: MAX_NESTING });
                }
                let id = self.u32(&|| format!("array type of {key:?}"))?;
                let ety = ValueType::from_id(id).ok_or_else(|| GgufError::BadValueType { key: key.to_string(), id })?;
                let n = self.count(ety.min_size(), &|| format!("array length of {key:?}"))?;
                if n > self.items_left {
                    return Err(GgufError::TooManyItems { key: key.to_string(), count: n, max: MAX_ARRAY_ITEMS });
                }
                self.items_left -= n;
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(self.value(ety, key, depth + 1)?);
                }
                Value::Array(ety, items)
            }
        })
    }
}

/// Parse everything before the data section and validate the tensor layout against `buf.len()`.
pub(crate) fn parse_header(buf: &[u8]) -> Result<Header, GgufError> {
    let mut c = Cursor { buf, pos: 0, items_left: MAX_ARRAY_ITEMS };
    let magic: [u8; 4] = c.array(&|| "magic".into())?;
    if magic != GGUF_MAGIC {
        return Err(GgufError::BadMagic(magic));
    }
    let version = c.u32(&|| "version".into())?;
    if version != 2 && version != 3 {
        return Err(GgufError::BadVersion(version));
    }
    // A tensor info takes at least 8 (name len) + 4 (n_dims) + 4 (type) + 8 (offset) bytes.
    let n_tensors = c.count(24, &|| "tensor count".into())?;
    let n_kv = c.count(12, &|| "metadata key/value count".into())?;

    let mut metadata: Vec<(String, Value)> = Vec::with_capacity(n_kv as usize);
    let mut seen = std::collections::HashSet::new();
    for i in 0..n_kv {
        let key = c.string(&|| format!("metadata key #{i}"))?;
        let id = c.u32(&|| format!("value type of {key:?}"))?;
        let ty = ValueType::from_id(id).ok_or_else(|| GgufError::BadValueType { key: key.clone(), id })?;
        let value = c.value(ty, &key, 0)?;
        if !seen.insert(key.clone()) {
            return Err(GgufError::DuplicateKey { key });
        }
        metadata.push((key, value));
    }

    let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some((_, v)) => {
            let a = v.as_u64().ok_or_else(|| GgufError::WrongType {
                key: "general.alignment".into(),
                expected: "unsigned integer".into(),
                found: v.type_name(),
            })?;
            if a == 0 || !a.is_power_of_two() || a > 1 << 20 {
                return Err(GgufError::BadAlignment(a));
            }
            a
        }
    };

    let mut tensors = Vec::with_capacity(n_tensors as usize);
    let mut names = std::collections::HashSet::new();
    for i in 0..n_tensors {
        let name = c.string(&|| format!("name of tensor #{i}"))?;
        let bad = |msg: String| GgufError::BadTensor { name: name.clone(), msg };
        let n_dims = c.u32(&|| format!("rank of tensor {name:?}"))? as usize;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(bad(format!("rank {n_dims} is outside 1..={MAX_DIMS}")));
        }
        let mut dims = Vec::with_capacity(n_dims);
        for _ in 0..n_dims {
            dims.push(c.u64(&|| format!("dims of tensor {name:?}"))?);
        }
        let id = c.u32(&|| format!("type of tensor {name:?}"))?;
        let ty = QuantType::from_ggml_id(id).ok_or_else(|| GgufError::UnknownType { name: name.clone(), id })?;
        let offset = c.u64(&|| format!("offset of tensor {name:?}"))?;
        if !names.insert(name.clone()) {
            return Err(GgufError::DuplicateTensor(name));
        }
        tensors.push(RawTensor { name, dims, ty, offset });
    }

    let data_offset = if n_tensors == 0 {
        c.pos
    } else {
        let padded = (c.pos as u64).div_ceil(alignment) * alignment;
        if padded > buf.len() as u64 {
            return Err(GgufError::Truncated {
                what: "padding before the data section".into(),
                offset: c.pos,
                needed: padded - c.pos as u64,
                len: buf.len(),
            });
        }
        padded as usize
    };
    validate_layout(&tensors, alignment, (buf.len() - data_offset) as u64)?;
    Ok(Header { version, metadata, tensors, alignment, data_offset })
}

/// Bytes a tensor of this type and shape occupies, with every overflow and shape rule checked.
pub(crate) fn tensor_nbytes(name: &str, ty: QuantType, dims: &[u64]) -> Result<u64, GgufError> {
    let bad = |msg: String| GgufError::BadTensor { name: name.to_string(), msg };
    let mut n: u64 = 1;
    for &d in dims {
        if d > i64::MAX as u64 {
            return Err(bad(format!("dimension {d} is negative or too large")));
        }
        n = n.checked_mul(d).filter(|&n| n <= i64::MAX as u64).ok_or_else(|| bad(format!("shape {dims:?} overflows")))?;
    }
    let bs = ty.block_size() as u64;
    if !dims[0].is_multiple_of(bs) {
        return Err(bad(format!("first dimension {} is not a multiple of the {} block size {bs}", dims[0], ty.name())));
    }
    (n / bs).checked_mul(ty.type_size() as u64).ok_or_else(|| bad(format!("byte size of shape {dims:?} overflows")))
}

fn validate_layout(tensors: &[RawTensor], alignment: u64, data_len: u64) -> Result<(), GgufError> {
    let mut spans = Vec::with_capacity(tensors.len());
    for t in tensors {
        let bad = |msg: String| GgufError::BadTensor { name: t.name.clone(), msg };
        let size = tensor_nbytes(&t.name, t.ty, &t.dims)?;
        if t.offset % alignment != 0 {
            return Err(bad(format!("offset {} is not a multiple of the alignment {alignment}", t.offset)));
        }
        let end = t.offset.checked_add(size).ok_or_else(|| bad("offset + size overflows".into()))?;
        if end > data_len {
            return Err(bad(format!("data [{}, {end}) lies outside the data section of {data_len} bytes (file truncated?)", t.offset)));
        }
        spans.push((t.offset, end, &t.name));
    }
    spans.sort();
    for w in spans.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(GgufError::Overlap { a: w[0].2.clone(), b: w[1].2.clone() });
        }
    }
    Ok(())
}
