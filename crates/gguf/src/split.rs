//! Models split over several files, as llama.cpp's `gguf-split` writes them: every file is a
//! GGUF file named `PREFIX-NNNNN-of-MMMMM.gguf` (1-based, five digits) carrying `split.no`
//! (0-based) and `split.count`; the first holds the metadata and `split.tensors.count`, and the
//! tensors are spread over all of them.

use crate::{Gguf, GgufError};
use std::path::{Path, PathBuf};

const COUNT: &str = "split.count";
const NO: &str = "split.no";
const TENSORS: &str = "split.tensors.count";

/// The name of file `no` (0-based) of `count` of a split model with this path prefix.
pub fn split_path(prefix: &str, no: usize, count: usize) -> String {
    format!("{prefix}-{:05}-of-{count:05}.gguf", no + 1)
}

/// Write `g` as a model split over `n` files named after `prefix` (as llama.cpp's
/// `gguf-split --split-max-tensors` does: the tensors in order, as evenly as they go; the
/// metadata in the first file, the split keys in every one); returns the files' paths.
pub fn write_split(g: &Gguf, prefix: &str, n: usize) -> Result<Vec<PathBuf>, GgufError> {
    let n = n.clamp(1, u16::MAX as usize);
    let per = g.tensors().len().div_ceil(n).max(1);
    let mut paths = vec![];
    for no in 0..n {
        let mut w = crate::GgufWriter::new();
        if no == 0 {
            for (k, v) in g.metadata().iter().filter(|(k, _)| !k.starts_with("split.")) {
                w.set(k, v.clone());
            }
        }
        w.set(NO, crate::Value::U16(no as u16)).set(COUNT, crate::Value::U16(n as u16));
        w.set(TENSORS, crate::Value::I32(g.tensors().len() as i32));
        let mine: Vec<_> = g.tensors().iter().skip(no * per).take(per).collect();
        for t in &mine {
            w.add_tensor(&t.name, &t.dims, t.ty)?;
        }
        let path = PathBuf::from(split_path(prefix, no, n));
        let mut out = std::io::BufWriter::new(std::fs::File::create(&path).map_err(|e| GgufError::io(&path, e))?);
        let mut sink = w.write_header(&mut out)?;
        for t in &mine {
            sink.write_tensor(g.tensor_bytes(t))?;
        }
        sink.finish()?;
        paths.push(path);
    }
    Ok(paths)
}

/// `split.count` where it is above 1 (None: a single file).
pub(crate) fn count(g: &Gguf) -> Result<Option<usize>, GgufError> {
    Ok(g.get_u64(COUNT)?.filter(|&n| n > 1).map(|n| n as usize))
}

/// The file opened must be the first of its model.
pub(crate) fn check_first(g: &Gguf, path: &Path) -> Result<(), GgufError> {
    match g.get_u64(NO)? {
        Some(0) | None => Ok(()),
        Some(no) => {
            Err(GgufError::Split(format!("{} is file {} of a split model; open the first one (…-00001-of-…)", path.display(), no + 1)))
        }
    }
}

/// Every file of the model, from the first one's path.
pub(crate) fn sibling_paths(first: &Path, count: usize) -> Result<Vec<PathBuf>, GgufError> {
    let name = first.to_string_lossy();
    let suffix = split_path("", 0, count);
    let prefix = name.strip_suffix(&suffix).ok_or_else(|| {
        GgufError::Split(format!("{name} has {COUNT} = {count} but is not named PREFIX{suffix} (llama.cpp's split file names)"))
    })?;
    Ok((0..count).map(|no| PathBuf::from(split_path(prefix, no, count))).collect())
}

/// A later file belongs where it was found.
pub(crate) fn check_part(part: &Gguf, path: &Path, no: usize) -> Result<(), GgufError> {
    match part.get_u64(NO)? {
        Some(n) if n as usize == no => Ok(()),
        Some(n) => Err(GgufError::Split(format!("{} says it is file {} of the model, expected {}", path.display(), n + 1, no + 1))),
        None => Err(GgufError::Split(format!("{} has no {NO}: not a file of a split model", path.display()))),
    }
}

/// Every tensor the first file announces was found.
pub(crate) fn check_total(g: &Gguf) -> Result<(), GgufError> {
    match g.get_u64(TENSORS)? {
        Some(n) if n as usize != g.tensors().len() => {
            Err(GgufError::Split(format!("{TENSORS} is {n} but the {} files hold {} tensors", g.n_files(), g.tensors().len())))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_llama_cpp() {
        assert_eq!(split_path("/m/gpt-oss-120b-mxfp4", 0, 3), "/m/gpt-oss-120b-mxfp4-00001-of-00003.gguf");
        let p = sibling_paths(Path::new("/m/a-00001-of-00002.gguf"), 2).unwrap();
        assert_eq!(p, vec![PathBuf::from("/m/a-00001-of-00002.gguf"), PathBuf::from("/m/a-00002-of-00002.gguf")]);
        assert!(sibling_paths(Path::new("/m/a.gguf"), 2).is_err());
    }
}
