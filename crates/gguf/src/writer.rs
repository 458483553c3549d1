//! `GgufWriter`: writes GGUF v3 files in the layout llama.cpp expects (tensors in order, each
//! padded to the alignment). Tensor data are streamed, so multi-GB files need no big buffers.

use crate::parse::tensor_nbytes;
use crate::value::Value;
use crate::{GgufError, TensorInfo, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS};
use quarrel_quant::QuantType;
use std::io::Write;

/// Collects metadata and tensor descriptions, then writes the header.
#[derive(Default)]
pub struct GgufWriter {
    kv: Vec<(String, Value)>,
    tensors: Vec<TensorInfo>,
    data_size: u64,
}

fn werr(e: std::io::Error) -> GgufError {
    GgufError::Writer(e.to_string())
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    fn alignment(&self) -> u64 {
        self.kv.iter().find(|(k, _)| k == "general.alignment").and_then(|(_, v)| v.as_u64()).unwrap_or(DEFAULT_ALIGNMENT)
    }

    /// Set (or replace) a metadata value.
    pub fn set(&mut self, key: &str, value: Value) -> &mut Self {
        if let Some(slot) = self.kv.iter_mut().find(|(k, _)| k == key) {
            slot.1 = value;
        } else {
            self.kv.push((key.to_string(), value));
        }
        self
    }

    /// Add a tensor description; its data must be written later in the same order.
    pub fn add_tensor(&mut self, name: &str, dims: &[u64], ty: QuantType) -> Result<(), GgufError> {
        if dims.is_empty() || dims.len() > MAX_DIMS {
            return Err(GgufError::BadTensor { name: name.into(), msg: format!("rank {} outside 1..=4", dims.len()) });
        }
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(GgufError::DuplicateTensor(name.into()));
        }
        let n_bytes = tensor_nbytes(name, ty, dims)?;
        let align = self.alignment();
        let offset = self.data_size;
        self.data_size = offset + n_bytes.div_ceil(align) * align;
        self.tensors.push(TensorInfo { name: name.into(), dims: dims.to_vec(), ty, offset, n_bytes, part: 0 });
        Ok(())
    }

    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// Write magic, metadata and tensor infos; returns a sink for the tensor data.
    pub fn write_header<W: Write>(&self, mut w: W) -> Result<TensorSink<W>, GgufError> {
        if let Some((_, v)) = self.kv.iter().find(|(k, _)| k == "general.alignment") {
            match v.as_u64() {
                Some(a) if a.is_power_of_two() && a <= 1 << 20 => {}
                _ => return Err(GgufError::Writer("general.alignment must be a power-of-two u32".into())),
            }
        }
        let mut head = Vec::new();
        head.extend_from_slice(&GGUF_MAGIC);
        head.extend_from_slice(&3u32.to_le_bytes());
        head.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        head.extend_from_slice(&(self.kv.len() as u64).to_le_bytes());
        for (k, v) in &self.kv {
            put_str(&mut head, k);
            head.extend_from_slice(&(v.value_type() as u32).to_le_bytes());
            put_value(&mut head, v)?;
        }
        for t in &self.tensors {
            put_str(&mut head, &t.name);
            head.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                head.extend_from_slice(&d.to_le_bytes());
            }
            head.extend_from_slice(&t.ty.ggml_id().to_le_bytes());
            head.extend_from_slice(&t.offset.to_le_bytes());
        }
        let align = self.alignment();
        let pad = (head.len() as u64).div_ceil(align) * align - head.len() as u64;
        head.resize(head.len() + pad as usize, 0);
        w.write_all(&head).map_err(werr)?;
        Ok(TensorSink { w, tensors: self.tensors.clone(), next: 0, written: 0, align })
    }

    /// Write a whole file into memory (small files, tests).
    pub fn to_bytes(&self, data: &[&[u8]]) -> Result<Vec<u8>, GgufError> {
        let mut sink = self.write_header(Vec::new())?;
        for d in data {
            sink.write_tensor(d)?;
        }
        sink.finish()
    }
}

/// Receives tensor data in the order the tensors were added.
pub struct TensorSink<W: Write> {
    w: W,
    tensors: Vec<TensorInfo>,
    next: usize,
    /// Bytes of the next tensor already written by `write_chunk`.
    written: u64,
    align: u64,
}

impl<W: Write> TensorSink<W> {
    /// The tensor whose data is expected next.
    pub fn next_tensor(&self) -> Option<&TensorInfo> {
        self.tensors.get(self.next)
    }

    /// Write the whole data of the next tensor.
    pub fn write_tensor(&mut self, bytes: &[u8]) -> Result<(), GgufError> {
        let t = self.tensors.get(self.next).ok_or_else(|| GgufError::Writer("more tensor data than tensors".into()))?;
        if self.written != 0 || bytes.len() as u64 != t.n_bytes {
            return Err(GgufError::Writer(format!("tensor {:?} needs {} bytes, got {}", t.name, t.n_bytes, bytes.len())));
        }
        self.write_chunk(bytes)
    }

    /// Write the next part of the current tensor's data; once all of it has come, the padding
    /// is written and the next tensor starts. Multi-GB tensors need no buffer of their size.
    pub fn write_chunk(&mut self, bytes: &[u8]) -> Result<(), GgufError> {
        let t = self.tensors.get(self.next).ok_or_else(|| GgufError::Writer("more tensor data than tensors".into()))?;
        let written = self.written + bytes.len() as u64;
        if written > t.n_bytes {
            return Err(GgufError::Writer(format!("tensor {:?} needs {} bytes, got {written}", t.name, t.n_bytes)));
        }
        self.w.write_all(bytes).map_err(werr)?;
        self.written = written;
        if written == t.n_bytes {
            let pad = t.n_bytes.div_ceil(self.align) * self.align - t.n_bytes;
            self.w.write_all(&vec![0u8; pad as usize]).map_err(werr)?;
            self.next += 1;
            self.written = 0;
        }
        Ok(())
    }

    pub fn finish(mut self) -> Result<W, GgufError> {
        if self.next != self.tensors.len() {
            return Err(GgufError::Writer(format!("only {} of {} tensors were written", self.next, self.tensors.len())));
        }
        self.w.flush().map_err(werr)?;
        Ok(self.w)
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value) -> Result<(), GgufError> {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::String(s) => put_str(out, s),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Array(ty, items) => {
            out.extend_from_slice(&(*ty as u32).to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for it in items {
                if it.value_type() != *ty {
                    return Err(GgufError::Writer(format!("array of {ty:?} holds a {}", it.type_name())));
                }
                put_value(out, it)?;
            }
        }
    }
    Ok(())
}
