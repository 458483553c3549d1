//! Errors of the tokenizer crate.

use thiserror::Error;

/// Everything that can go wrong loading a tokenizer or rendering a chat template.
/// Encoding and decoding themselves never fail.
#[derive(Debug, Error)]
pub enum TokenizerError {
    /// The GGUF metadata could not be read (wrong type of a key, ...).
    #[error(transparent)]
    Gguf(#[from] quarrel_gguf::GgufError),
    /// A required metadata key is absent.
    #[error("missing tokenizer metadata key {0:?}")]
    MissingKey(String),
    /// A metadata value is present but unusable.
    #[error("tokenizer metadata key {key:?}: {msg}")]
    InvalidMetadata { key: String, msg: String },
    /// A tokenizer model or pre-tokenizer this crate does not implement.
    #[error("unsupported tokenizer: {0}")]
    Unsupported(String),
    /// A pre-tokenizer regex failed to compile (a bug in the regex translation).
    #[error("pre-tokenizer regex: {0}")]
    Regex(String),
    /// `apply_chat_template` on a model without `tokenizer.chat_template`.
    #[error("the model has no chat template (tokenizer.chat_template)")]
    NoChatTemplate,
    /// The template called `raise_exception(msg)`.
    #[error("chat template raised an exception: {0}")]
    TemplateException(String),
    /// The template failed to parse or render.
    #[error("chat template error: {0}")]
    Template(String),
}
