//! Token -> bytes (llama.cpp's `token_to_piece`), whole-sequence decoding
//! (`llama_detokenize`) and a streaming [`Detokenizer`] that only ever emits complete UTF-8.

use crate::unicode::char_to_byte;
use crate::vocab::{TokenAttr, Vocab, VocabKind};
use crate::Tokenizer;

/// The piece of every token, rendered with `special = true` (llama.cpp's piece cache).
pub(crate) fn build_pieces(vocab: &Vocab) -> Vec<Box<[u8]>> {
    (0..vocab.n_tokens() as u32).map(|id| piece_uncached(vocab, id).into_boxed_slice()).collect()
}

fn byte_token_value(text: &str) -> Option<u8> {
    // "<0xNN>"
    let hex = text.get(3..5)?;
    u8::from_str_radix(hex, 16).ok()
}

fn piece_uncached(vocab: &Vocab, id: u32) -> Vec<u8> {
    let attr = vocab.attr(id);
    let text = &vocab.tokens[id as usize];
    if attr.has(TokenAttr::UNKNOWN | TokenAttr::CONTROL | TokenAttr::USER_DEFINED) {
        return text.as_bytes().to_vec();
    }
    if attr.is_normal() {
        return match vocab.kind {
            VocabKind::Spm | VocabKind::Wpm => text.replace('\u{2581}', " ").into_bytes(),
            VocabKind::Bpe => decode_byte_level(text),
        };
    }
    if attr.is_byte() {
        return byte_token_value(text).map(|b| vec![b]).unwrap_or_default();
    }
    Vec::new() // unused / undefined tokens render as nothing
}

/// GPT-2 byte-level decoding of a token text (llama.cpp's `llama_decode_text`).
fn decode_byte_level(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        match char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                // llama.cpp's marker for a character outside the byte map
                out.extend_from_slice(b"[UNK_BYTE_0x");
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text.as_bytes());
                out.push(b']');
            }
        }
    }
    out
}

/// How [`Tokenizer::decode_with`] renders a sequence of ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeOptions {
    /// Render control and unknown tokens as their text (llama.cpp `unparse_special`).
    /// When false they decode to nothing.
    pub render_special: bool,
    /// Drop a leading BOS / trailing EOS when the model adds them (llama.cpp `remove_special`).
    pub remove_special: bool,
    /// The ids start a sequence: for vocabularies with `add_space_prefix`, the one leading
    /// space of the first token is removed (llama.cpp's `lstrip` on the first piece). Set
    /// this to false when decoding a continuation (e.g. generated text after a prompt).
    pub sequence_start: bool,
    /// Apply llama.cpp's `clean_up_tokenization_spaces` passes when the vocabulary asks for
    /// them (" ," -> ",", " 's" -> "'s", ...).
    pub clean_spaces: bool,
}

impl Default for DecodeOptions {
    /// llama.cpp's `llama_detokenize(remove_special = false, unparse_special = false)`.
    fn default() -> Self {
        DecodeOptions { render_special: false, remove_special: false, sequence_start: true, clean_spaces: true }
    }
}

impl Tokenizer {
    /// The bytes of one token; control/unknown tokens give their text when `special` is
    /// true and nothing otherwise. Out-of-range ids give nothing.
    pub fn piece_bytes(&self, id: u32, special: bool) -> &[u8] {
        let Some(p) = self.pieces.get(id as usize) else {
            return &[];
        };
        if !special && self.vocab.attr(id).has(TokenAttr::UNKNOWN | TokenAttr::CONTROL) {
            return &[];
        }
        p
    }

    /// The bytes of one token (see [`Tokenizer::piece_bytes`]).
    pub fn token_to_piece(&self, id: u32, special: bool) -> Vec<u8> {
        self.piece_bytes(id, special).to_vec()
    }

    /// Decodes a whole sequence to bytes (no UTF-8 repair).
    pub fn decode_bytes(&self, ids: &[u32], opts: DecodeOptions) -> Vec<u8> {
        let mut ids = ids;
        let mut remove_space = self.vocab.add_space_prefix && opts.sequence_start;
        if opts.remove_special && self.vocab.add_bos {
            if let (Some(&first), Some(bos)) = (ids.first(), self.vocab.ids.bos) {
                if first == bos {
                    remove_space = false;
                    ids = &ids[1..];
                }
            }
        }
        if opts.remove_special && self.vocab.add_eos {
            if let (Some(&last), Some(eos)) = (ids.last(), self.vocab.ids.eos) {
                if last == eos {
                    ids = &ids[..ids.len() - 1];
                }
            }
        }
        let mut out = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            let mut p = self.piece_bytes(id, opts.render_special);
            if remove_space && p.first() == Some(&b' ') {
                p = &p[1..];
            }
            remove_space = false;
            out.extend_from_slice(p);
        }
        if opts.clean_spaces && self.vocab.clean_spaces {
            clean_up_spaces(&mut out);
        }
        out
    }

    /// Decodes a whole sequence with llama.cpp's default detokenization (control tokens
    /// hidden, the prefix space of SPM vocabularies removed, clean-up as the vocabulary asks);
    /// invalid UTF-8 becomes U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        self.decode_with(ids, DecodeOptions::default())
    }

    /// Decodes a whole sequence with explicit options; invalid UTF-8 becomes U+FFFD.
    pub fn decode_with(&self, ids: &[u32], opts: DecodeOptions) -> String {
        match String::from_utf8(self.decode_bytes(ids, opts)) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }
    }
}

/// llama.cpp's three clean-up passes over the detokenized bytes, ported literally (in
/// place, including the NUL it writes over a removed space in the second pass).
fn clean_up_spaces(text: &mut Vec<u8>) {
    let mut total = text.len();
    // first pass: " ?", " !", " .", " ,"
    let total1 = total;
    total = usize::from(total > 0);
    for i in 1..total1 {
        let x = text[i];
        if text[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            total -= 1;
        }
        text[total] = x;
        total += 1;
    }
    // second pass: " ' " -> "'"
    let total2 = total;
    total = usize::from(total > 0);
    let mut i = 1;
    while i < total2 {
        let x = text[i];
        if x == b'\'' && i + 1 < total2 && text[i - 1] == b' ' && text[i + 1] == b' ' {
            total -= 1;
            i += 1;
            text[i] = 0;
        }
        text[total] = x;
        total += 1;
        i += 1;
    }
    // third pass: " 's", " 'm", " 're", " 've"
    let total3 = total;
    total = usize::from(total > 0);
    for i in 1..total3 {
        let x = text[i];
        if text[i - 1] == b' ' && x == b'\'' && i + 1 < total3 {
            let x1 = text[i + 1];
            if x1 == b's' || x1 == b'm' {
                total -= 1;
            } else if x1 != b't' && x1 != b'd' && i + 2 < total3 {
                let x2 = text[i + 2];
                if x2 == b'e' && (x1 == b'r' || x1 == b'v') {
                    total -= 1;
                }
            }
        }
        text[total] = x;
        total += 1;
    }
    text.truncate(total);
}

/// Streaming detokenization: push ids one at a time, get text back as soon as it forms
/// complete UTF-8. Incomplete multi-byte sequences are held back until the bytes that
/// complete them arrive; bytes that can never become valid UTF-8 come out as U+FFFD
/// (exactly as `String::from_utf8_lossy` of the whole output would render them).
///
/// Defaults suit generation after a prompt: control tokens are hidden and no leading
/// space is removed, so the concatenated output equals
/// `decode_with(ids, DecodeOptions { sequence_start: false, clean_spaces: false, .. })`,
/// which is `decode(ids)` for vocabularies without `add_space_prefix` and clean-up
/// (SmolLM2, Qwen2, Gemma 3, ...).
#[derive(Clone, Debug, Default)]
pub struct Detokenizer {
    pending: Vec<u8>,
    render_special: bool,
    strip_first_space: bool,
    started: bool,
}

impl Detokenizer {
    /// A detokenizer for a continuation (nothing stripped, control tokens hidden).
    pub fn new() -> Detokenizer {
        Detokenizer::default()
    }

    /// Render control tokens as their text.
    pub fn render_special(mut self, yes: bool) -> Detokenizer {
        self.render_special = yes;
        self
    }

    /// Treat the first pushed id as the start of a sequence: for vocabularies with
    /// `add_space_prefix`, its leading space is removed (as [`Tokenizer::decode`] does).
    pub fn sequence_start(mut self, yes: bool) -> Detokenizer {
        self.strip_first_space = yes;
        self
    }

    /// Appends one token; returns the newly completed text, if any.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Option<String> {
        let mut p = tok.piece_bytes(id, self.render_special);
        if !self.started {
            self.started = true;
            if self.strip_first_space && tok.vocab.add_space_prefix && p.first() == Some(&b' ') {
                p = &p[1..];
            }
        }
        self.pending.extend_from_slice(p);
        let s = self.take_complete();
        (!s.is_empty()).then_some(s)
    }

    /// Emits whatever is still held back (an incomplete sequence becomes U+FFFD).
    pub fn flush(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }

    /// Whether bytes are held back waiting for the rest of a character.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    fn take_complete(&mut self) -> String {
        let mut out = String::new();
        let mut consumed = 0;
        loop {
            let rest = &self.pending[consumed..];
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    consumed = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // valid_up_to bytes are valid UTF-8
                    out.push_str(std::str::from_utf8(&rest[..valid]).unwrap_or_default());
                    match e.error_len() {
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            consumed += valid + bad;
                        }
                        None => {
                            consumed += valid; // incomplete tail: wait for more bytes
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..consumed);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_up() {
        let mut t = b"Hello , world ! it 's a ' quote ' we 've I 'll".to_vec();
        clean_up_spaces(&mut t);
        assert_eq!(String::from_utf8(t).unwrap(), "Hello, world! it's a'quote'we've I 'll");
        let mut t = b"x ' ' y".to_vec();
        clean_up_spaces(&mut t);
        assert_eq!(String::from_utf8(t).unwrap(), "x'' y");
    }
}
