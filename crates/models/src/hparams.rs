//! Typed access to `{arch}.<suffix>` metadata keys, with errors naming the key.

use quarrel_core::{CoreError, Result};
use quarrel_gguf::Gguf;

/// The largest count or dimension a header may give (context lengths of real models are far
/// below; 2^32 tokens would not fit any KV cache).
const MAX_HPARAM: u64 = 1 << 32;

pub struct Hparams<'a> {
    pub g: &'a Gguf,
    pub arch: String,
}

impl<'a> Hparams<'a> {
    pub fn new(g: &'a Gguf) -> Result<Self> {
        Ok(Hparams { g, arch: g.architecture()?.to_string() })
    }

    fn key(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.arch)
    }

    pub fn usize(&self, suffix: &str) -> Result<usize> {
        let k = self.key(suffix);
        self.sized(&k, self.g.require_u64(&k)?)
    }

    pub fn usize_or(&self, suffix: &str, default: usize) -> Result<usize> {
        Ok(self.opt_usize(suffix)?.unwrap_or(default))
    }

    pub fn opt_usize(&self, suffix: &str) -> Result<Option<usize>> {
        let k = self.key(suffix);
        self.g.get_u64(&k)?.map(|v| self.sized(&k, v)).transpose()
    }

    /// Counts and dimensions size buffers: a value no real model has (a corrupt or hostile
    /// header) is an error here, before anything is allocated from it.
    fn sized(&self, key: &str, v: u64) -> Result<usize> {
        if v > MAX_HPARAM {
            return Err(CoreError::Model(format!("{key} = {v} is out of range (at most {MAX_HPARAM})")));
        }
        Ok(v as usize)
    }

    pub fn f32_or(&self, suffix: &str, default: f32) -> Result<f32> {
        let k = self.key(suffix);
        match self.g.get_f64(&k)? {
            None => Ok(default),
            Some(v) if v.is_finite() && (v as f32).is_finite() => Ok(v as f32),
            Some(v) => Err(CoreError::Model(format!("{k} = {v} is not a finite f32"))),
        }
    }

    /// `block_count`, checked against the file: the last layer's tensors must be there, so a
    /// layer count the tensors do not back fails before anything is sized by it.
    pub fn block_count(&self) -> Result<usize> {
        let n = self.positive("block_count")?;
        let last = format!("blk.{}.", n - 1);
        if n > self.g.tensors().len() || !self.g.tensors().iter().any(|t| t.name.starts_with(&last)) {
            return Err(CoreError::Model(format!("{} = {n}, but the file has no tensors for layer {}", self.key("block_count"), n - 1)));
        }
        Ok(n)
    }

    pub fn opt_str(&self, suffix: &str) -> Result<Option<&'a str>> {
        Ok(self.g.get_str(&self.key(suffix))?)
    }

    /// A value that must be positive, with a clear error otherwise.
    pub fn positive(&self, suffix: &str) -> Result<usize> {
        let v = self.usize(suffix)?;
        if v == 0 {
            return Err(CoreError::Model(format!("{} must be positive", self.key(suffix))));
        }
        Ok(v)
    }

    /// Vocabulary size: `{arch}.vocab_size` or the token list length.
    pub fn n_vocab(&self) -> Result<usize> {
        if let Some(n) = self.opt_usize("vocab_size")? {
            return Ok(n);
        }
        Ok(self.g.get_array("tokenizer.ggml.tokens")?.map_or(0, |a| a.len()))
    }

    pub fn opt_bool(&self, suffix: &str) -> Result<Option<bool>> {
        Ok(self.g.get_bool(&self.key(suffix))?)
    }

    /// A per-layer value: an array of `n_layer` integers, or one integer for all layers, or
    /// `default` when absent (an error when there is no default).
    pub fn per_layer(&self, suffix: &str, n_layer: usize, default: Option<usize>) -> Result<Vec<usize>> {
        let k = self.key(suffix);
        if let Some(items) = self.g.get_array(&k).ok().flatten() {
            if items.len() != n_layer {
                return Err(CoreError::Model(format!("{k} has {} values for {n_layer} layers", items.len())));
            }
            return items
                .iter()
                .map(|v| v.as_u64().ok_or_else(|| CoreError::Model(format!("{k}: non-integer value"))).and_then(|x| self.sized(&k, x)))
                .collect();
        }
        match (self.g.get_u64(&k)?, default) {
            (Some(v), _) => Ok(vec![self.sized(&k, v)?; n_layer]),
            (None, Some(d)) => Ok(vec![d; n_layer]),
            (None, None) => Err(CoreError::Gguf(quarrel_gguf::GgufError::MissingKey(k))),
        }
    }
}
