//! Models split over several files (llama.cpp's `gguf-split` layout): opened from the first
//! file, the tensors of every file read as one model; a missing or misnumbered file, a tensor
//! count that does not add up, or opening a later file is an error that names the problem.

mod common;
use common::sample_file;
use quarrel_gguf::{Gguf, GgufWriter, Value};
use std::path::{Path, PathBuf};

/// `g` written over `n` files in `dir`: the first file's path.
fn write_split(g: &Gguf, dir: &Path, n: usize) -> PathBuf {
    quarrel_gguf::write_split(g, &dir.join("model").to_string_lossy(), n).unwrap().remove(0)
}

/// Rewrite the file at `path` with one metadata value changed.
fn rewrite(path: &Path, key: &str, value: Value) {
    let g = Gguf::open_single(path).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata() {
        w.set(k, if k == key { value.clone() } else { v.clone() });
    }
    g.tensors().iter().for_each(|t| w.add_tensor(&t.name, &t.dims, t.ty).unwrap());
    let data: Vec<&[u8]> = g.tensors().iter().map(|t| g.tensor_bytes(t)).collect();
    let bytes = w.to_bytes(&data).unwrap();
    drop(g);
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn a_split_model_reads_as_one() {
    let whole = Gguf::from_bytes(sample_file()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let first = write_split(&whole, dir.path(), 3);
    let g = Gguf::open(&first).unwrap();
    assert_eq!(g.n_files(), 3);
    assert_eq!(g.architecture().unwrap(), "llama");
    assert_eq!(g.tensors().len(), whole.tensors().len());
    for t in whole.tensors() {
        let (info, bytes) = g.tensor(&t.name).unwrap();
        assert_eq!((&info.dims, info.ty), (&t.dims, t.ty));
        assert_eq!(bytes, whole.tensor_bytes(t), "{}", t.name);
    }
}

#[test]
fn broken_splits_are_errors() {
    let whole = Gguf::from_bytes(sample_file()).unwrap();
    let err = |p: &Path| Gguf::open(p).err().map(|e| e.to_string()).unwrap_or_default();
    let dir = tempfile::tempdir().unwrap();
    let first = write_split(&whole, dir.path(), 3);
    // a later file opened first
    let second = PathBuf::from(first.to_string_lossy().replace("00001-of", "00002-of"));
    assert!(err(&second).contains("open the first one"), "{}", err(&second));
    // a file missing
    std::fs::remove_file(first.to_string_lossy().replace("00001-of", "00003-of")).unwrap();
    assert!(err(&first).contains("00003-of-00003.gguf"), "{}", err(&first));
    // the announced tensor count does not add up
    let dir = tempfile::tempdir().unwrap();
    let first = write_split(&whole, dir.path(), 2);
    rewrite(&first, "split.tensors.count", Value::I32(7));
    assert!(err(&first).contains("split.tensors.count is 7"), "{}", err(&first));
    // a first file renamed away from the split naming
    let renamed = dir.path().join("renamed.gguf");
    std::fs::rename(&first, &renamed).unwrap();
    assert!(err(&renamed).contains("not named"), "{}", err(&renamed));
}
