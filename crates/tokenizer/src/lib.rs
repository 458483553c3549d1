//! # quarrel-tokenizer
//!
//! Text <-> token ids for GGUF models, matching llama.cpp's tokenizer id for id: byte-level
//! BPE (`tokenizer.ggml.model = "gpt2"`, with the pre-tokenizer named by
//! `tokenizer.ggml.pre`), SentencePiece (`"llama"`, e.g. Llama 2, Gemma) and WordPiece
//! (`"bert"`, BERT-family encoders). Also decoding
//! (whole sequences and streaming) and chat-template rendering.
//!
//! ```text
//!  encode:  text ─► special.rs (cut out <|im_start|>-like tokens) ─► fragments
//!             raw fragment ─► BPE: pretokenize.rs/split_custom.rs (words) ─► bpe.rs (merges by rank)
//!                          ├► SPM: spm.rs (spaces → ▁, merges by score, <0xNN> byte fallback)
//!                          └► WPM: wpm.rs (normalized words, longest vocabulary entries; [CLS] .. [SEP])
//!           + BOS/EOS per metadata ─► Vec<u32>
//!  decode:  ids ─► detok.rs piece cache (byte-level / ▁ / <0xNN>) ─► bytes ─► String
//!           streaming: Detokenizer holds back incomplete UTF-8
//!  chat:    messages ─► chat.rs (minijinja, HF semantics) ─► prompt text ─► encode
//! ```
//!
//! | module | responsibility |
//! |---|---|
//! | `vocab` | GGUF metadata → tokens, scores, attributes, special ids, EOG set, flags |
//! | `pretok_table` | llama.cpp's `tokenizer.ggml.pre` names, flags and regexes, transcribed |
//! | `pretokenize` | BPE word splitting (regex steps; generic path via the category collapse) |
//! | `split_custom` | llama.cpp's hand-written GPT-2 / Llama 3 / Qwen2 / Qwen3.5 / newline splitters |
//! | `unicode` | codepoint categories as llama.cpp sees them; GPT-2 byte↔char map |
//! | `bpe` | merge-rank BPE over interned ids |
//! | `spm` | score-driven SentencePiece merging with byte fallback |
//! | `symbols` | the linked symbol chain and merge step BPE and SPM share |
//! | `special` | special-token partitioning (`tokenizer_st_partition`, lstrip/rstrip) |
//! | `detok` | token → piece, `decode`, streaming `Detokenizer` |
//! | `chat` | `ChatTemplate`, `ChatMessage` |
//! | `error` | `TokenizerError` |
//! | `hash` | fast hasher for the token and merge maps |
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let gguf = quarrel_gguf::Gguf::open("model.gguf")?;
//! let tok = quarrel_tokenizer::Tokenizer::from_gguf(&gguf)?;
//! let ids = tok.encode("Hello world", true, true);
//! assert_eq!(tok.decode(&ids), "Hello world");
//! # Ok(()) }
//! ```

mod bpe;
mod chat;
mod chat_prompt;
mod detok;
mod error;
mod hash;
mod pretok_table;
mod pretokenize;
mod rerank;
mod special;
mod split_custom;
mod spm;
mod symbols;
mod unicode;
mod vocab;
mod wpm;

pub use chat::{ChatMessage, ChatOptions, ChatTemplate, ToolCall};
pub use detok::{DecodeOptions, Detokenizer};
pub use error::TokenizerError;
pub use pretok_table::PreKind;
pub use vocab::{SpecialIds, TokenAttr, VocabKind};
pub use wpm::Normalizer;

use quarrel_gguf::Gguf;

use bpe::BpeModel;
use special::{Fragment, SpecialMatcher};
use vocab::Vocab;

/// A tokenizer loaded from GGUF metadata. Immutable and `Sync`: share it freely.
pub struct Tokenizer {
    vocab: Vocab,
    bpe: Option<BpeModel>,
    special: SpecialMatcher,
    pieces: Vec<Box<[u8]>>,
    chat_template: Option<String>,
    /// `tokenizer.chat_template.rerank`: how a reranker wants its query and document.
    rerank_template: Option<String>,
    /// The chat template compiled on first use (an error as its message).
    compiled: std::sync::OnceLock<Result<Option<ChatTemplate>, String>>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.vocab.kind)
            .field("pre", &self.vocab.pre_name)
            .field("n_vocab", &self.vocab.n_tokens())
            .field("ids", &self.vocab.ids)
            .finish()
    }
}

impl Tokenizer {
    /// Builds the tokenizer from the `tokenizer.*` metadata of a GGUF file.
    pub fn from_gguf(g: &Gguf) -> Result<Tokenizer, TokenizerError> {
        let vocab = Vocab::from_gguf(g)?;
        let bpe = match vocab.kind {
            VocabKind::Bpe => Some(BpeModel::from_gguf(g, &vocab)?),
            VocabKind::Spm | VocabKind::Wpm => None,
        };
        let special = SpecialMatcher::new(&vocab);
        let pieces = detok::build_pieces(&vocab);
        let chat_template = g.get_str("tokenizer.chat_template")?.map(str::to_string);
        let rerank_template = g.get_str("tokenizer.chat_template.rerank")?.map(str::to_string);
        Ok(Tokenizer { vocab, bpe, special, pieces, chat_template, rerank_template, compiled: Default::default() })
    }

    /// Tokenizes `text`. With `add_special`, BOS/EOS are added as the model's metadata says
    /// (`add_bos_token` / `add_eos_token`); with `parse_special`, texts of control tokens
    /// (e.g. `<|im_start|>`) become those tokens (user-defined tokens always do).
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let whole = 0..text.len();
        self.encode_with_plain(text, add_special, if parse_special { &[] } else { std::slice::from_ref(&whole) })
    }

    /// [`encode`](Self::encode) with special tokens parsed except inside the byte ranges
    /// `plain` (sorted, disjoint): there control tokens' texts stay text.
    pub fn encode_with_plain(&self, text: &str, add_special: bool, plain: &[std::ops::Range<usize>]) -> Vec<u32> {
        let v = &self.vocab;
        let frags = self.special.partition(v, text, plain);
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if v.kind == VocabKind::Wpm {
            // llama.cpp: [CLS] and [SEP] around the text whenever special tokens are added
            if add_special {
                out.extend(v.ids.bos);
            }
            for f in frags {
                match f {
                    Fragment::Text(a, b) => wpm::encode(v, v.normalizer, v.max_token_len, &text[a..b], &mut out),
                    Fragment::Token(id) => out.push(id),
                }
            }
            if add_special {
                out.extend(v.ids.sep);
            }
            return out;
        }
        if add_special && v.add_bos {
            out.extend(v.ids.bos);
        }
        match &self.bpe {
            Some(bpe) => {
                for f in frags {
                    match f {
                        Fragment::Text(a, b) => bpe.encode_fragment(v, &text[a..b], &mut out),
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
            None => {
                let mut prev_special = true; // a space prefix goes at the start and after specials
                for f in frags {
                    match f {
                        Fragment::Text(a, b) => {
                            let escaped = spm::escape_whitespace(&text[a..b], v.add_space_prefix && prev_special);
                            spm::encode_escaped(v, &escaped, &mut out);
                            prev_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                    }
                }
            }
        }
        if add_special && v.add_eos {
            out.extend(v.ids.eos);
        }
        out
    }

    /// A streaming detokenizer with default options (see [`Detokenizer`]).
    pub fn detokenizer(&self) -> Detokenizer {
        Detokenizer::new()
    }

    /// Whether generating `id` ends the turn (EOS, EOT such as `<|im_end|>` /
    /// `<end_of_turn>` / `<|eot_id|>`, and the other tokens llama.cpp treats as EOG).
    pub fn is_eog(&self, id: u32) -> bool {
        self.vocab.eog.contains(&id)
    }

    /// All end-of-generation ids, ascending.
    pub fn eog_ids(&self) -> Vec<u32> {
        self.vocab.eog.iter().copied().collect()
    }

    /// BPE, SPM or WordPiece.
    pub fn kind(&self) -> VocabKind {
        self.vocab.kind
    }

    /// `tokenizer.ggml.model` as stored.
    pub fn model_name(&self) -> &str {
        &self.vocab.model
    }

    /// `tokenizer.ggml.pre` as stored ("" when absent).
    pub fn pre_name(&self) -> &str {
        &self.vocab.pre_name
    }

    /// The resolved pre-tokenizer type (BPE only).
    pub fn pre_kind(&self) -> Option<PreKind> {
        self.vocab.pre.map(|p| p.kind)
    }

    /// Number of tokens in the vocabulary.
    pub fn n_vocab(&self) -> usize {
        self.vocab.n_tokens()
    }

    /// What loading ignored, one message per key naming it and its value: special-token ids
    /// outside the vocabulary (the default id stays, as in llama.cpp). Callers show them to
    /// the operator.
    pub fn load_warnings(&self) -> &[String] {
        &self.vocab.ignored_ids
    }

    /// Special token ids after llama.cpp's defaults and detection.
    pub fn special_ids(&self) -> SpecialIds {
        self.vocab.ids
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.vocab.ids.bos
    }
    pub fn eos_id(&self) -> Option<u32> {
        self.vocab.ids.eos
    }
    pub fn eot_id(&self) -> Option<u32> {
        self.vocab.ids.eot
    }
    pub fn unk_id(&self) -> Option<u32> {
        self.vocab.ids.unk
    }
    pub fn pad_id(&self) -> Option<u32> {
        self.vocab.ids.pad
    }

    /// Whether `encode(.., add_special = true, ..)` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.vocab.add_bos
    }
    /// Whether `encode(.., add_special = true, ..)` appends EOS.
    pub fn add_eos(&self) -> bool {
        self.vocab.add_eos
    }
    /// Whether a space is put in front of the text (SPM).
    pub fn add_space_prefix(&self) -> bool {
        self.vocab.add_space_prefix
    }

    /// The stored text of a token (byte-level/▁ encoded as in the vocabulary).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.vocab.tokens.get(id as usize).map(String::as_str)
    }

    /// The id of a token by its stored text.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.token_to_id.get(text).copied()
    }

    /// A token's attributes (control, user-defined, byte, ...); default for invalid ids.
    pub fn token_attr(&self, id: u32) -> TokenAttr {
        self.vocab.attr(id)
    }

    /// A token's score (SPM merge priority).
    pub fn token_score(&self, id: u32) -> f32 {
        self.vocab.scores.get(id as usize).copied().unwrap_or(0.0)
    }

    /// `tokenizer.chat_template`, if the model has one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Use `source` as the chat template in place of the model's; refused (the tokenizer
    /// unchanged) when it does not compile.
    pub fn set_chat_template(&mut self, source: String) -> Result<(), TokenizerError> {
        let old = self.chat_template.replace(source);
        let old_compiled = std::mem::take(&mut self.compiled);
        if let Err(e) = self.compiled_chat_template() {
            self.chat_template = old;
            self.compiled = old_compiled;
            return Err(e);
        }
        Ok(())
    }

    /// Renders `messages` with the model's chat template (HF semantics). Errors with
    /// [`TokenizerError::NoChatTemplate`] when the model has none (then use
    /// [`Tokenizer::fallback_chatml`] if ChatML suits the model).
    pub fn apply_chat_template(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String, TokenizerError> {
        self.compiled_chat_template()?.ok_or(TokenizerError::NoChatTemplate)?.render(messages, add_generation_prompt)
    }

    /// The model's chat template compiled (once), with its BOS / EOS texts (None: the model
    /// has none).
    pub(crate) fn compiled_chat_template(&self) -> Result<Option<&ChatTemplate>, TokenizerError> {
        let compiled = self.compiled.get_or_init(|| {
            let Some(src) = self.chat_template.as_deref() else { return Ok(None) };
            let text = |id: Option<u32>| id.and_then(|i| self.token_text(i)).unwrap_or("").to_string();
            ChatTemplate::new(src, &text(self.vocab.ids.bos), &text(self.vocab.ids.eos)).map(Some).map_err(|e| match e {
                TokenizerError::Template(m) => m,
                other => other.to_string(),
            })
        });
        compiled.as_ref().map(Option::as_ref).map_err(|m| TokenizerError::Template(m.clone()))
    }

    /// Plain ChatML, for models without a template.
    pub fn fallback_chatml(messages: &[ChatMessage], add_generation_prompt: bool) -> String {
        ChatTemplate::fallback_chatml(messages, add_generation_prompt)
    }
}
