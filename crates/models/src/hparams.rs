//! Typed access to `{arch}.<suffix>` metadata keys, with errors naming the key and value.
//!
//! Every architecture reads its hyperparameters through [`Hparams`], so this is the one place
//! that checks them against what a model can be, before anything is sized by them:
//!
//! | value | rule |
//! |---|---|
//! | counts and dimensions | at most 2^32 ([`Hparams::usize`] and friends) |
//! | `block_count` | positive, and equal to the layers the file has tensors for |
//! | float values | finite in f32; epsilons and RoPE scaling factors not negative, RoPE bases positive ([`FLOAT_RULES`]) |
//! | `rope.dimension_count` | even, in `2..=head_dim` ([`Hparams::rope_dims`]) |
//!
//! Shapes that depend on each other (head counts dividing, tensor shapes matching the
//! dimensions) are checked by the loaders against the tensors the file really has.

use quarrel_core::{CoreError, Result};
use quarrel_gguf::Gguf;

/// The largest count or dimension a header may give (context lengths of real models are far
/// below; 2^32 tokens would not fit any KV cache).
const MAX_HPARAM: u64 = 1 << 32;

/// What a float hyperparameter must be beyond finite, by key suffix: a negative epsilon
/// takes the square root of a negative number in RMSNorm, a RoPE base of zero or below makes
/// every rotation angle infinite or NaN, and so does a negative scaling factor (0 means "no
/// scaling" in llama.cpp, so it stays allowed).
pub const FLOAT_RULES: &[(&str, FloatRule)] = &[
    ("attention.layer_norm_rms_epsilon", FloatRule::NonNegative),
    ("attention.layer_norm_epsilon", FloatRule::NonNegative),
    ("rope.freq_base", FloatRule::Positive),
    ("rope.freq_base_swa", FloatRule::Positive),
    ("rope.scaling.factor", FloatRule::NonNegative),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FloatRule {
    NonNegative,
    Positive,
}

impl FloatRule {
    fn allows(self, v: f32) -> bool {
        match self {
            FloatRule::NonNegative => v >= 0.0,
            FloatRule::Positive => v > 0.0,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            FloatRule::NonNegative => "must not be negative",
            FloatRule::Positive => "must be positive",
        }
    }
}

pub struct Hparams<'a> {
    pub g: &'a Gguf,
    pub arch: String,
}

impl<'a> Hparams<'a> {
    pub fn new(g: &'a Gguf) -> Result<Self> {
        Ok(Hparams { g, arch: g.architecture()?.to_string() })
    }

    /// The full key of `suffix`: `{arch}.<suffix>`.
    pub fn key(&self, suffix: &str) -> String {
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
        let v = match self.g.get_f64(&k)? {
            None => return Ok(default),
            Some(v) if v.is_finite() && (v as f32).is_finite() => v as f32,
            Some(v) => return Err(CoreError::Model(format!("{k} = {v} is not a finite f32"))),
        };
        match FLOAT_RULES.iter().find(|(s, _)| *s == suffix) {
            Some((_, rule)) if !rule.allows(v) => Err(CoreError::Model(format!("{k} = {v} {}", rule.describe()))),
            _ => Ok(v),
        }
    }

    /// `block_count`, checked against the file: the layers must be exactly those the file has
    /// tensors for, so a count the tensors do not back fails before anything is sized by it,
    /// and a smaller one cannot silently drop layers (llama.cpp refuses both: its loader
    /// counts the tensors it used).
    pub fn block_count(&self) -> Result<usize> {
        let n = self.positive("block_count")?;
        let key = self.key("block_count");
        let last = format!("blk.{}.", n - 1);
        if n > self.g.tensors().len() || !self.g.tensors().iter().any(|t| t.name.starts_with(&last)) {
            return Err(CoreError::Model(format!("{key} = {n}, but the file has no tensors for layer {}", n - 1)));
        }
        if let Some(beyond) = self.g.tensors().iter().filter_map(|t| layer_of(&t.name)).filter(|&il| il >= n).max() {
            return Err(CoreError::Model(format!("{key} = {n}, but the file has tensors for layer {beyond} (blk.{beyond}.*)")));
        }
        Ok(n)
    }

    /// `rope.dimension_count` (default: all of `head_dim`): RoPE turns pairs of values, so the
    /// count is even and within the head; 0 would silently drop the positions.
    pub fn rope_dims(&self, head_dim: usize) -> Result<usize> {
        let n = self.usize_or("rope.dimension_count", head_dim)?;
        if n == 0 || n % 2 != 0 || n > head_dim {
            let k = self.key("rope.dimension_count");
            return Err(CoreError::Model(format!("{k} = {n} must be even and in 2..={head_dim} (the head dimension)")));
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

/// The layer index of a per-layer tensor name (`blk.<il>.…`).
fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}
