//! Typed access to `{arch}.<suffix>` metadata keys, with errors naming the key.

use quarrel_core::{CoreError, Result};
use quarrel_gguf::Gguf;

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
        Ok(self.g.require_u64(&k)? as usize)
    }

    pub fn usize_or(&self, suffix: &str, default: usize) -> Result<usize> {
        Ok(self.g.get_u64(&self.key(suffix))?.map_or(default, |v| v as usize))
    }

    pub fn opt_usize(&self, suffix: &str) -> Result<Option<usize>> {
        Ok(self.g.get_u64(&self.key(suffix))?.map(|v| v as usize))
    }

    pub fn f32_or(&self, suffix: &str, default: f32) -> Result<f32> {
        Ok(self.g.get_f64(&self.key(suffix))?.map_or(default, |v| v as f32))
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
                .map(|v| v.as_u64().map(|x| x as usize).ok_or_else(|| CoreError::Model(format!("{k}: non-integer value"))))
                .collect();
        }
        match (self.g.get_u64(&k)?, default) {
            (Some(v), _) => Ok(vec![v as usize; n_layer]),
            (None, Some(d)) => Ok(vec![d; n_layer]),
            (None, None) => Err(CoreError::Gguf(quarrel_gguf::GgufError::MissingKey(k))),
        }
    }
}
