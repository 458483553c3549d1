//! Errors for reading and writing GGUF files.

use thiserror::Error;

/// Everything that can be wrong with a GGUF file. Messages name the key or tensor at fault.
#[derive(Debug, Error)]
pub enum GgufError {
    #[error("i/o error on {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("not a GGUF file: bad magic {0:02x?} (expected \"GGUF\")")]
    BadMagic([u8; 4]),
    #[error("unsupported GGUF version {0} (supported: 2 and 3)")]
    BadVersion(u32),
    #[error("file truncated: needed {needed} bytes at offset {offset} while reading {what}, file has {len}")]
    Truncated { what: String, offset: usize, needed: u64, len: usize },
    #[error("absurd {what}: {count} (only {remaining} bytes left in the file)")]
    AbsurdCount { what: String, count: u64, remaining: usize },
    #[error("metadata key {key:?}: unknown value type id {id}")]
    BadValueType { key: String, id: u32 },
    #[error("metadata key {key:?}: invalid UTF-8 in string")]
    BadUtf8 { key: String },
    #[error("metadata key {key:?} appears twice")]
    DuplicateKey { key: String },
    #[error("metadata key {key:?}: an array of {count} items would pass the {max} array items a header may hold")]
    TooManyItems { key: String, count: u64, max: u64 },
    #[error("metadata key {key:?}: arrays nested deeper than {max} levels")]
    TooDeep { key: String, max: usize },
    #[error("general.alignment = {0} is invalid (must be a power of two, at most 1 MiB)")]
    BadAlignment(u64),
    #[error("tensor {name:?}: {msg}")]
    BadTensor { name: String, msg: String },
    #[error("tensor {name:?}: unknown ggml type id {id}")]
    UnknownType { name: String, id: u32 },
    #[error("tensors {a:?} and {b:?} overlap in the data section")]
    Overlap { a: String, b: String },
    #[error("tensor name {0:?} appears twice")]
    DuplicateTensor(String),
    #[error("metadata key {key:?}: expected {expected}, found {found}")]
    WrongType { key: String, expected: String, found: String },
    #[error("missing metadata key {0:?}")]
    MissingKey(String),
    #[error("missing tensor {0:?}")]
    MissingTensor(String),
    #[error("split model: {0}")]
    Split(String),
    #[error("writer: {0}")]
    Writer(String),
}

impl GgufError {
    pub(crate) fn io(path: &std::path::Path, source: std::io::Error) -> Self {
        GgufError::Io { path: path.display().to_string(), source }
    }
}
