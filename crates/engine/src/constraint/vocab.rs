//! llguidance's token table (a `TokTrie`) from Quarrel's tokenizer: every token's bytes as
//! the detokenizer writes them. Control, unknown and unused tokens get llguidance's special
//! marker (0xFF, which no UTF-8 text contains) in front of their name, so no grammar text
//! can be spelled with them; user-defined tokens (`<tool_call>` in Qwen's vocabulary, say)
//! are text. The end-of-generation tokens are the trie's EOS set: the grammar lets them
//! through once it may end.

use quarrel_tokenizer::Tokenizer;
use std::sync::Arc;
use toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};

/// The bytes each token stands for, in llguidance's convention.
pub(super) fn token_bytes(tok: &Tokenizer) -> Vec<Vec<u8>> {
    (0..tok.n_vocab() as u32)
        .map(|id| {
            let attr = tok.token_attr(id);
            let special = attr.is_control() || attr.is_unknown() || attr.is_unused();
            let piece = if special { vec![] } else { tok.token_to_piece(id, false) };
            if piece.is_empty() {
                let name = tok.token_text(id).filter(|t| !t.is_empty()).map(str::to_string).unwrap_or_else(|| format!("<[{id}]>"));
                let mut b = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                b.extend_from_slice(name.as_bytes());
                b
            } else {
                piece
            }
        })
        .collect()
}

pub(super) fn tok_env(tok: &Tokenizer) -> Result<TokEnv, String> {
    let words = token_bytes(tok);
    if words.is_empty() {
        return Err("the tokenizer has no tokens".into());
    }
    let mut eog = tok.eog_ids();
    eog.retain(|&t| (t as usize) < words.len());
    eog.sort_unstable();
    eog.dedup();
    // the first listed EOS is the one llguidance names; any of them ends the output
    let first = tok.eot_id().or(tok.eos_id()).filter(|t| eog.contains(t)).or(eog.first().copied());
    let Some(first) = first else {
        return Err("the tokenizer has no end-of-generation token, which constrained output needs to end".into());
    };
    eog.retain(|&t| t != first);
    eog.insert(0, first);
    let mut info = TokRxInfo::new(words.len() as u32, first);
    info.tok_bos = tok.bos_id();
    let trie = TokTrie::from(&info, &words).with_eos_tokens(&eog);
    // greedy tokenization of forced text is an approximation, which llguidance is told
    // (it only matters for forced tokens, which Quarrel does not use)
    Ok(Arc::new(ApproximateTokEnv::new(trie)))
}
