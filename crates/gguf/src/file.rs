//! `Gguf`: an opened GGUF file, or a model split over several (`split.count`, see `split`).
//! Tensor data are views into the mmaps, never copies.

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
    /// The file of a split model that holds the tensor (0: the first, or the only one).
    pub part: usize,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// One file's mapping and where its data section starts.
struct Part {
    storage: Storage,
    data_offset: usize,
}

/// An opened GGUF model: metadata (of its first file), tensor table and zero-copy tensor data.
pub struct Gguf {
    parts: Vec<Part>,
    pub version: u32,
    pub alignment: u64,
    metadata: Vec<(String, Value)>,
    meta_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl Gguf {
    /// Memory-map and parse a file; the first file of a split model
    /// (`NAME-00001-of-0000N.gguf`) brings its other files, found beside it by name.
    pub fn open(path: impl AsRef<Path>) -> Result<Gguf, GgufError> {
        let path = path.as_ref();
        let mut g = Self::open_single(path)?;
        if let Some(n) = crate::split::count(&g)? {
            crate::split::check_first(&g, path)?;
            for (idx, p) in crate::split::sibling_paths(path, n)?.iter().enumerate().skip(1) {
                let part = Self::open_single(p)?;
                crate::split::check_part(&part, p, idx)?;
                g.append(part)?;
            }
            crate::split::check_total(&g)?;
        }
        Ok(g)
    }

    /// Memory-map and parse one file, without bringing the other files of a split model.
    pub fn open_single(path: impl AsRef<Path>) -> Result<Gguf, GgufError> {
        Self::from_storage(Storage::Mmap(map(path.as_ref())?))
    }

    /// Add the tensors of another file of the same split model.
    fn append(&mut self, other: Gguf) -> Result<(), GgufError> {
        let part = self.parts.len();
        for mut t in other.tensors {
            if self.tensor_index.contains_key(&t.name) {
                return Err(GgufError::DuplicateTensor(t.name));
            }
            t.part = part;
            self.tensor_index.insert(t.name.clone(), self.tensors.len());
            self.tensors.push(t);
        }
        self.parts.extend(other.parts);
        Ok(())
    }

    /// How many files the model spans.
    pub fn n_files(&self) -> usize {
        self.parts.len()
    }

    /// Check a whole file image without keeping it (fuzzing, corruption tests).
    pub fn validate(bytes: &[u8]) -> Result<(), GgufError> {
        parse_header(bytes).map(|_| ())
    }

    /// Offset of the tensor data section from the start of the (first) file.
    pub fn data_offset(&self) -> usize {
        self.parts[0].data_offset
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
            tensors.push(TensorInfo { name: t.name, dims: t.dims, ty: t.ty, offset: t.offset, n_bytes, part: 0 });
        }
        let meta_index = h.metadata.iter().enumerate().map(|(i, (k, _))| (k.clone(), i)).collect();
        let tensor_index = tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
        Ok(Gguf {
            parts: vec![Part { storage, data_offset: h.data_offset }],
            version: h.version,
            alignment: h.alignment,
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
        let part = &self.parts[info.part];
        let start = part.data_offset + info.offset as usize;
        &part.storage.bytes()[start..start + info.n_bytes as usize]
    }

    /// Look up a tensor by name and return its info and bytes.
    pub fn tensor(&self, name: &str) -> Result<(&TensorInfo, &[u8]), GgufError> {
        let info = self.tensor_info(name).ok_or_else(|| GgufError::MissingTensor(name.to_string()))?;
        Ok((info, self.tensor_bytes(info)))
    }

    /// Size of the whole model in bytes (every file of a split model).
    pub fn file_size(&self) -> usize {
        self.parts.iter().map(|p| p.storage.bytes().len()).sum()
    }
}

fn map(path: &Path) -> Result<memmap2::Mmap, GgufError> {
    let file = std::fs::File::open(path).map_err(|e| GgufError::io(path, e))?;
    // SAFETY: the file is mapped read-only; like every mmap user we assume it is not truncated
    // underneath us while mapped.
    unsafe { memmap2::Mmap::map(&file) }.map_err(|e| GgufError::io(path, e))
}
