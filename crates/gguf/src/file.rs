//! `Gguf`: an opened GGUF file. Tensor data are views into the mmap, never copies.

use crate::parse::{parse_header, tensor_nbytes};
use crate::value::Value;
use crate::GgufError;
use quarrel_quant::QuantType;
use std::collections::HashMap;
use std::path::Path;

enum Storage {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mmap(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// Description of one tensor; `dims` in ggml order (dims[0] is the contiguous row length).
#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: QuantType,
    /// Offset from the start of the data section.
    pub offset: u64,
    pub n_bytes: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// An opened GGUF file: metadata, tensor table and zero-copy tensor data.
pub struct Gguf {
    storage: Storage,
    pub version: u32,
    pub alignment: u64,
    data_offset: usize,
    metadata: Vec<(String, Value)>,
    meta_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl Gguf {
    /// Memory-map and parse a file.
    pub fn open(path: impl AsRef<Path>) -> Result<Gguf, GgufError> {
        let path = path.as_ref();
        let file = std::fs::File::open(path).map_err(|e| GgufError::io(path, e))?;
        // SAFETY: the file is mapped read-only; like every mmap user we assume it is not
        // truncated underneath us while mapped.
        let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| GgufError::io(path, e))?;
        Self::from_storage(Storage::Mmap(mmap))
    }

    /// Check a whole file image without keeping it (fuzzing, corruption tests).
    pub fn validate(bytes: &[u8]) -> Result<(), GgufError> {
        parse_header(bytes).map(|_| ())
    }

    /// Offset of the tensor data section from the start of the file.
    pub fn data_offset(&self) -> usize {
        self.data_offset
    }

    /// Parse an in-memory file (tests, fuzzing).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Gguf, GgufError> {
        Self::from_storage(Storage::Owned(bytes))
    }

    fn from_storage(storage: Storage) -> Result<Gguf, GgufError> {
        let h = parse_header(storage.bytes())?;
        let mut tensors = Vec::with_capacity(h.tensors.len());
        for t in h.tensors {
            let n_bytes = tensor_nbytes(&t.name, t.ty, &t.dims)?;
            tensors.push(TensorInfo { name: t.name, dims: t.dims, ty: t.ty, offset: t.offset, n_bytes });
        }
        let meta_index = h.metadata.iter().enumerate().map(|(i, (k, _))| (k.clone(), i)).collect();
        let tensor_index = tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
        Ok(Gguf {
            storage,
            version: h.version,
            alignment: h.alignment,
            data_offset: h.data_offset,
            metadata: h.metadata,
            meta_index,
            tensors,
            tensor_index,
        })
    }

    /// All metadata in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.meta_index.get(key).map(|&i| &self.metadata[i].1)
    }

    fn typed<T>(&self, key: &str, expected: &str, f: impl Fn(&Value) -> Option<T>) -> Result<Option<T>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => f(v).map(Some).ok_or_else(|| GgufError::WrongType {
                key: key.to_string(),
                expected: expected.to_string(),
                found: v.type_name(),
            }),
        }
    }

    /// An unsigned integer value (any integer width), `Ok(None)` when absent.
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>, GgufError> {
        self.typed(key, "unsigned integer", Value::as_u64)
    }

    pub fn get_f64(&self, key: &str) -> Result<Option<f64>, GgufError> {
        self.typed(key, "number", Value::as_f64)
    }

    pub fn get_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        self.typed(key, "bool", Value::as_bool)
    }

    pub fn get_str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(GgufError::WrongType { key: key.into(), expected: "string".into(), found: v.type_name() }),
        }
    }

    pub fn get_array(&self, key: &str) -> Result<Option<&[Value]>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(_, items)) => Ok(Some(items)),
            Some(v) => Err(GgufError::WrongType { key: key.into(), expected: "array".into(), found: v.type_name() }),
        }
    }

    /// A required unsigned integer.
    pub fn require_u64(&self, key: &str) -> Result<u64, GgufError> {
        self.get_u64(key)?.ok_or_else(|| GgufError::MissingKey(key.to_string()))
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Result<&str, GgufError> {
        self.get_str("general.architecture")?.ok_or_else(|| GgufError::MissingKey("general.architecture".into()))
    }

    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The bytes of a tensor, borrowed from the mapping (bounds were checked at open).
    pub fn tensor_bytes(&self, info: &TensorInfo) -> &[u8] {
        let start = self.data_offset + info.offset as usize;
        &self.storage.bytes()[start..start + info.n_bytes as usize]
    }

    /// Look up a tensor by name and return its info and bytes.
    pub fn tensor(&self, name: &str) -> Result<(&TensorInfo, &[u8]), GgufError> {
        let info = self.tensor_info(name).ok_or_else(|| GgufError::MissingTensor(name.to_string()))?;
        Ok((info, self.tensor_bytes(info)))
    }

    /// Size of the whole file in bytes.
    pub fn file_size(&self) -> usize {
        self.storage.bytes().len()
    }
}
