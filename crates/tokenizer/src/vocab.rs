//! The vocabulary as llama.cpp's `llama_vocab::impl::load` builds it from GGUF metadata:
//! token texts, scores and attributes, the special token ids (with llama.cpp's per-type
//! defaults and its text-based detection of EOT/EOM/FIM tokens), the end-of-generation
//! set, and the flags that steer tokenization (add_bos, add_space_prefix, ...).

use std::collections::{BTreeSet, HashMap};

use quarrel_gguf::{Gguf, Value};

use crate::error::TokenizerError;
pub(crate) use crate::hash::FastHash;
use crate::pretok_table::{pre_config, PreConfig};

/// Per-token attributes, llama.cpp's `llama_token_attr` bits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TokenAttr(pub u32);

impl TokenAttr {
    pub const UNDEFINED: u32 = 0;
    pub const UNKNOWN: u32 = 1 << 0;
    pub const UNUSED: u32 = 1 << 1;
    pub const NORMAL: u32 = 1 << 2;
    pub const CONTROL: u32 = 1 << 3;
    pub const USER_DEFINED: u32 = 1 << 4;
    pub const BYTE: u32 = 1 << 5;
    pub const NORMALIZED: u32 = 1 << 6;
    pub const LSTRIP: u32 = 1 << 7;
    pub const RSTRIP: u32 = 1 << 8;
    pub const SINGLE_WORD: u32 = 1 << 9;

    /// Whether any of the given bits is set.
    #[inline]
    pub fn has(self, bits: u32) -> bool {
        self.0 & bits != 0
    }
    pub fn is_control(self) -> bool {
        self.has(Self::CONTROL)
    }
    pub fn is_byte(self) -> bool {
        self.has(Self::BYTE)
    }
    pub fn is_user_defined(self) -> bool {
        self.has(Self::USER_DEFINED)
    }
    pub fn is_unknown(self) -> bool {
        self.has(Self::UNKNOWN)
    }
    pub fn is_unused(self) -> bool {
        self.has(Self::UNUSED)
    }
    pub fn is_normal(self) -> bool {
        self.has(Self::NORMAL)
    }

    /// From a `tokenizer.ggml.token_type` value.
    fn from_token_type(t: i64) -> TokenAttr {
        TokenAttr(match t {
            1 => Self::NORMAL,
            2 => Self::UNKNOWN,
            3 => Self::CONTROL,
            4 => Self::USER_DEFINED,
            5 => Self::UNUSED,
            6 => Self::BYTE,
            _ => Self::UNDEFINED,
        })
    }
}

/// The tokenizer algorithm family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VocabKind {
    /// `tokenizer.ggml.model = "gpt2"`: byte-level BPE with merges and a regex pre-tokenizer.
    Bpe,
    /// `tokenizer.ggml.model = "llama"`: SentencePiece-style merging by score with byte fallback.
    Spm,
    /// `tokenizer.ggml.model = "bert"`: WordPiece (BERT-family encoders).
    Wpm,
}

/// Special token ids (None = absent, llama.cpp's `LLAMA_TOKEN_NULL`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecialIds {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    pub pad: Option<u32>,
    pub mask: Option<u32>,
    pub fim_pre: Option<u32>,
    pub fim_suf: Option<u32>,
    pub fim_mid: Option<u32>,
    pub fim_pad: Option<u32>,
    pub fim_rep: Option<u32>,
    pub fim_sep: Option<u32>,
}

pub(crate) struct Vocab {
    pub kind: VocabKind,
    pub model: String,
    pub pre_name: String,
    pub pre: Option<PreConfig>,
    pub tokens: Vec<String>,
    pub scores: Vec<f32>,
    pub attrs: Vec<TokenAttr>,
    pub token_to_id: HashMap<String, u32, FastHash>,
    pub ids: SpecialIds,
    pub add_bos: bool,
    pub add_eos: bool,
    /// A separator between the two texts of a pair (llama.cpp's `add_sep`: rerank inputs).
    pub add_sep: bool,
    pub add_space_prefix: bool,
    pub clean_spaces: bool,
    pub ignore_merges: bool,
    /// WordPiece: BertNormalizer's options and the longest token text in bytes.
    pub normalizer: crate::wpm::Normalizer,
    pub max_token_len: usize,
    pub eog: BTreeSet<u32>,
    /// Control, user-defined and unknown tokens, longest text first (tokenizer_st_partition order).
    pub special_tokens: Vec<u32>,
    /// Special-id keys whose value was ignored (outside the vocabulary, negative, not an
    /// integer), one message each naming the key and value: llama.cpp's load warnings.
    pub ignored_ids: Vec<String>,
}

/// Accessor for one field of [`SpecialIds`].
type SlotFn = fn(&mut SpecialIds) -> &mut Option<u32>;

const K_MODEL: &str = "tokenizer.ggml.model";
const K_PRE: &str = "tokenizer.ggml.pre";
const K_TOKENS: &str = "tokenizer.ggml.tokens";
const K_SCORES: &str = "tokenizer.ggml.scores";
const K_TYPES: &str = "tokenizer.ggml.token_type";

/// Candidate texts, in priority order, for the ids llama.cpp detects by text.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_PRE_TEXTS: &[&str] =
    &["<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>", "<|prefix|>"];
const FIM_SUF_TEXTS: &[&str] =
    &["<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>", "<|suffix|>"];
const FIM_MID_TEXTS: &[&str] =
    &["<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>", "<|middle|>"];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];
/// Texts that always end generation.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

fn invalid(key: &str, msg: impl Into<String>) -> TokenizerError {
    TokenizerError::InvalidMetadata { key: key.to_string(), msg: msg.into() }
}

fn array<'g>(g: &'g Gguf, key: &str) -> Result<Option<&'g [Value]>, TokenizerError> {
    Ok(g.get_array(key)?)
}

impl Vocab {
    pub(crate) fn from_gguf(g: &Gguf) -> Result<Vocab, TokenizerError> {
        let model = g.get_str(K_MODEL)?.ok_or_else(|| TokenizerError::MissingKey(K_MODEL.into()))?.to_string();
        let pre_name = g.get_str(K_PRE)?.unwrap_or("").to_string();
        let kind = match model.as_str() {
            "gpt2" => VocabKind::Bpe,
            "llama" => VocabKind::Spm,
            "bert" => VocabKind::Wpm,
            other => {
                return Err(TokenizerError::Unsupported(format!(
                    "tokenizer.ggml.model = {other:?} (supported: \"gpt2\" byte-level BPE, \"llama\" SentencePiece, \"bert\" WordPiece)"
                )))
            }
        };

        // tokens, scores, types
        let toks = array(g, K_TOKENS)?.ok_or_else(|| TokenizerError::MissingKey(K_TOKENS.into()))?;
        if toks.len() > u32::MAX as usize / 2 {
            return Err(invalid(K_TOKENS, "too many tokens"));
        }
        let n = toks.len();
        let mut tokens = Vec::with_capacity(n);
        for (i, v) in toks.iter().enumerate() {
            let s = v.as_str().ok_or_else(|| invalid(K_TOKENS, format!("element {i} is {}, not a string", v.type_name())))?;
            tokens.push(if s.is_empty() { format!("[EMPTY_{i}]") } else { s.to_string() });
        }
        let mut scores = vec![0.0f32; n];
        if let Some(arr) = array(g, K_SCORES)? {
            if arr.len() < n {
                return Err(invalid(K_SCORES, format!("{} scores for {n} tokens", arr.len())));
            }
            for (i, v) in arr.iter().take(n).enumerate() {
                scores[i] = v.as_f64().ok_or_else(|| invalid(K_SCORES, "scores must be numbers"))? as f32;
            }
        }
        let mut attrs = vec![TokenAttr(TokenAttr::NORMAL); n];
        if let Some(arr) = array(g, K_TYPES)? {
            if arr.len() < n {
                return Err(invalid(K_TYPES, format!("{} token types for {n} tokens", arr.len())));
            }
            for (i, v) in arr.iter().take(n).enumerate() {
                let t = v.as_i64().ok_or_else(|| invalid(K_TYPES, "token types must be integers"))?;
                attrs[i] = TokenAttr::from_token_type(t);
            }
        }
        let mut token_to_id = HashMap::with_capacity_and_hasher(n, FastHash::default());
        for (i, t) in tokens.iter().enumerate() {
            token_to_id.insert(t.clone(), i as u32); // a later duplicate wins, as in llama.cpp
        }

        // per-type defaults
        let (mut ids, pre, mut add_bos, mut add_space_prefix, clean_spaces, ignore_merges);
        ids = SpecialIds::default();
        match kind {
            VocabKind::Spm => {
                ids.bos = Some(1);
                ids.eos = Some(2);
                ids.unk = Some(0);
                pre = None;
                add_bos = true;
                add_space_prefix = true;
                clean_spaces = false;
                ignore_merges = false;
            }
            VocabKind::Wpm => {
                // [CLS] text [SEP]
                ids.bos = Some(101);
                ids.unk = Some(100);
                ids.sep = Some(102);
                ids.pad = Some(0);
                ids.mask = Some(103);
                pre = None;
                add_bos = true;
                add_space_prefix = false;
                clean_spaces = true;
                ignore_merges = false;
            }
            VocabKind::Bpe => {
                let cfg =
                    pre_config(&pre_name).ok_or_else(|| TokenizerError::Unsupported(format!("unknown pre-tokenizer type {pre_name:?}")))?;
                ids.bos = if cfg.bos_null { None } else { Some(11) };
                ids.eos = Some(11);
                add_bos = cfg.add_bos;
                add_space_prefix = false;
                clean_spaces = cfg.clean_spaces;
                ignore_merges = cfg.ignore_merges;
                pre = Some(cfg);
            }
        }
        let mut add_eos = false;
        if let Some(v) = g.get_bool("tokenizer.ggml.add_space_prefix")? {
            add_space_prefix = v;
        }

        // special ids from metadata
        let mut ignored_ids = Vec::new();
        {
            let slots: [(&str, SlotFn); 17] = [
                ("tokenizer.ggml.bos_token_id", |s| &mut s.bos),
                ("tokenizer.ggml.eos_token_id", |s| &mut s.eos),
                ("tokenizer.ggml.eot_token_id", |s| &mut s.eot),
                ("tokenizer.ggml.eom_token_id", |s| &mut s.eom),
                ("tokenizer.ggml.unknown_token_id", |s| &mut s.unk),
                ("tokenizer.ggml.seperator_token_id", |s| &mut s.sep),
                ("tokenizer.ggml.padding_token_id", |s| &mut s.pad),
                ("tokenizer.ggml.mask_token_id", |s| &mut s.mask),
                ("tokenizer.ggml.fim_pre_token_id", |s| &mut s.fim_pre),
                ("tokenizer.ggml.fim_suf_token_id", |s| &mut s.fim_suf),
                ("tokenizer.ggml.fim_mid_token_id", |s| &mut s.fim_mid),
                ("tokenizer.ggml.fim_pad_token_id", |s| &mut s.fim_pad),
                ("tokenizer.ggml.fim_rep_token_id", |s| &mut s.fim_rep),
                ("tokenizer.ggml.fim_sep_token_id", |s| &mut s.fim_sep),
                ("tokenizer.ggml.prefix_token_id", |s| &mut s.fim_pre),
                ("tokenizer.ggml.suffix_token_id", |s| &mut s.fim_suf),
                ("tokenizer.ggml.middle_token_id", |s| &mut s.fim_mid),
            ];
            for (key, slot) in slots {
                let slot = slot(&mut ids);
                if slot.is_some_and(|id| id as usize >= n) {
                    *slot = None; // default out of range: disabled
                }
                if let Some(v) = g.get(key) {
                    // out-of-range or negative values keep the default, like llama.cpp
                    // (a file may name a padding id just past its tokens; refusing it would
                    // refuse models llama.cpp runs), and are reported like its warnings
                    match v.as_u64() {
                        Some(id) if id < n as u64 => *slot = Some(id as u32),
                        _ => ignored_ids.push(format!("{key} = {v} is outside the vocabulary of {n} tokens: ignored")),
                    }
                }
            }
        }
        if let Some(v) = g.get_bool("tokenizer.ggml.add_bos_token")? {
            add_bos = v;
        }
        if let Some(v) = g.get_bool("tokenizer.ggml.add_eos_token")? {
            add_eos = v;
        }
        let mut add_sep = kind == VocabKind::Wpm;
        if let Some(v) = g.get_bool("tokenizer.ggml.add_sep_token")? {
            add_sep = v;
        }
        if add_bos && ids.bos.is_none() {
            add_bos = false; // llama.cpp would assert; we simply cannot add it
        }
        if add_eos && ids.eos.is_none() {
            add_eos = false;
        }

        // BertNormalizer: lower-cased unless the file says not, accents stripped as lower-cased
        let lowercase = g.get_bool("tokenizer.ggml.normalizer.lowercase")?.unwrap_or(true);
        let strip_accents = g.get_bool("tokenizer.ggml.normalizer.strip_accents")?.unwrap_or(lowercase);
        let max_token_len = tokens.iter().map(String::len).max().unwrap_or(0);
        let mut v = Vocab {
            kind,
            model,
            pre_name,
            pre,
            tokens,
            scores,
            attrs,
            token_to_id,
            ids,
            add_bos,
            add_eos,
            add_sep,
            add_space_prefix,
            clean_spaces,
            ignore_merges,
            normalizer: crate::wpm::Normalizer { lowercase, strip_accents },
            max_token_len,
            eog: BTreeSet::new(),
            special_tokens: Vec::new(),
            ignored_ids,
        };
        v.detect_special_by_text();
        v.mark_unused();
        v.build_eog();
        v.special_tokens = v.special_cache();
        let name = g.get_str("general.name").ok().flatten().unwrap_or("").to_lowercase();
        v.apply_model_attrs(&name, g.get_str("general.architecture").ok().flatten().unwrap_or(""));
        Ok(v)
    }

    pub(crate) fn n_tokens(&self) -> usize {
        self.tokens.len()
    }

    #[inline]
    pub(crate) fn attr(&self, id: u32) -> TokenAttr {
        self.attrs.get(id as usize).copied().unwrap_or_default()
    }

    fn add_attr(&mut self, id: u32, bits: u32) {
        if let Some(a) = self.attrs.get_mut(id as usize) {
            a.0 |= bits;
        }
    }

    fn find_first(&self, texts: &[&str]) -> Option<u32> {
        texts.iter().find_map(|t| self.token_to_id.get(*t).copied())
    }

    /// EOT/EOM/FIM ids found by their text when the metadata does not give them; the
    /// found token is forced to CONTROL. (llama.cpp scans a hash map, so with several
    /// candidates its pick is arbitrary; we take the first in its candidate list.)
    fn detect_special_by_text(&mut self) {
        let lists: [(&[&str], SlotFn); 8] = [
            (EOT_TEXTS, |s| &mut s.eot),
            (EOM_TEXTS, |s| &mut s.eom),
            (FIM_PRE_TEXTS, |s| &mut s.fim_pre),
            (FIM_SUF_TEXTS, |s| &mut s.fim_suf),
            (FIM_MID_TEXTS, |s| &mut s.fim_mid),
            (FIM_PAD_TEXTS, |s| &mut s.fim_pad),
            (FIM_REP_TEXTS, |s| &mut s.fim_rep),
            (FIM_SEP_TEXTS, |s| &mut s.fim_sep),
        ];
        for (texts, slot) in lists {
            if slot(&mut self.ids).is_none() {
                if let Some(id) = self.find_first(texts) {
                    *slot(&mut self.ids) = Some(id);
                    self.add_attr(id, TokenAttr::CONTROL);
                }
            }
        }
    }

    /// Control tokens whose text contains "unused" are marked UNUSED.
    fn mark_unused(&mut self) {
        for i in 0..self.attrs.len() {
            if self.attrs[i].is_control() && self.tokens[i].contains("unused") {
                self.attrs[i].0 |= TokenAttr::UNUSED;
            }
        }
    }

    fn build_eog(&mut self) {
        let mut eog = BTreeSet::new();
        for id in [self.ids.fim_pad, self.ids.fim_rep, self.ids.fim_sep].into_iter().flatten() {
            eog.insert(id);
        }
        for t in EOG_TEXTS {
            if let Some(&id) = self.token_to_id.get(*t) {
                eog.insert(id);
                self.add_attr(id, TokenAttr::CONTROL);
            }
        }
        // gpt-oss: always render these
        for t in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
            if let Some(&id) = self.token_to_id.get(t) {
                self.attrs[id as usize] = TokenAttr(TokenAttr::USER_DEFINED);
            }
        }
        for id in [self.ids.eos, self.ids.eot, self.ids.eom].into_iter().flatten() {
            eog.insert(id);
        }
        let text = |id: u32| self.tokens.get(id as usize).map(String::as_str).unwrap_or("");
        // o200k_harmony / solar-open: "<|end|>" is not EOG when the return/call tokens exist
        let has = |set: &BTreeSet<u32>, t: &str| set.iter().any(|&id| text(id) == t);
        let end_id = eog.iter().copied().find(|&id| text(id) == "<|end|>");
        if let Some(end_id) = end_id {
            let ret = has(&eog, "<|return|>");
            let call = has(&eog, "<|call|>") || has(&eog, "<|calls|>");
            let flush = has(&eog, "<|flush|>");
            if call && (ret || flush) {
                eog.remove(&end_id);
                self.attrs[end_id as usize] = TokenAttr(TokenAttr::USER_DEFINED);
            }
        }
        // gemma4 / plamo: "</s>" is a normal token there
        let s_id = eog.iter().copied().find(|&id| text(id) == "</s>");
        if let Some(s_id) = s_id {
            if has(&eog, "<|tool_response>") || has(&eog, "<|plamo:eos|>") {
                eog.remove(&s_id);
                self.attrs[s_id as usize] = TokenAttr(TokenAttr::NORMAL);
            }
        }
        self.eog = eog;
    }

    fn special_cache(&self) -> Vec<u32> {
        let mask = TokenAttr::CONTROL | TokenAttr::USER_DEFINED | TokenAttr::UNKNOWN;
        let mut ids: Vec<u32> = (0..self.attrs.len() as u32).filter(|&i| self.attrs[i as usize].has(mask)).collect();
        ids.sort_by(|&a, &b| self.tokens[b as usize].len().cmp(&self.tokens[a as usize].len()));
        ids
    }

    /// llama.cpp's per-model LSTRIP/RSTRIP attributes (set after the special cache is built).
    fn apply_model_attrs(&mut self, name_lower: &str, arch: &str) {
        let set = |v: &mut Vocab, t: &str, bit: u32, on: bool| {
            if let Some(&id) = v.token_to_id.get(t) {
                let a = &mut v.attrs[id as usize].0;
                *a = if on { *a | bit } else { *a & !bit };
            }
        };
        let pre = self.pre_name.clone();
        if ["jina-v2-de", "jina-v2-es", "jina-v2-code"].iter().any(|p| pre.contains(p))
            || ["nomic-bert-moe", "jina-bert-v3"].iter().any(|p| arch.contains(p))
        {
            set(self, "<mask>", TokenAttr::LSTRIP, true);
        } else if name_lower.contains("phi-3") || name_lower.contains("phi3") {
            for id in self.special_tokens.clone() {
                self.attrs[id as usize].0 |= TokenAttr::RSTRIP;
            }
            set(self, "</s>", TokenAttr::RSTRIP, true);
            for t in ["<unk>", "<s>", "<|endoftext|>"] {
                set(self, t, TokenAttr::RSTRIP, false);
            }
        } else if name_lower.contains("modern-bert") {
            set(self, "[MASK]", TokenAttr::LSTRIP, true);
        }
    }

    /// llama.cpp's `byte_to_token` for SPM: `<0xXX>`, else the byte itself as a token.
    pub(crate) fn spm_byte_token(&self, b: u8) -> Option<u32> {
        const HEX: &[u8; 16] = b"0123456789ABCDEF";
        let name = [b'<', b'0', b'x', HEX[(b >> 4) as usize], HEX[(b & 15) as usize], b'>'];
        // name is ASCII
        let name = std::str::from_utf8(&name).unwrap_or("");
        if let Some(&id) = self.token_to_id.get(name) {
            return Some(id);
        }
        if b < 0x80 {
            let s = [b];
            if let Ok(s) = std::str::from_utf8(&s) {
                return self.token_to_id.get(s).copied();
            }
        }
        None
    }
}
