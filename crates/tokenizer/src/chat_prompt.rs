//! A chat prompt as tokens, with what clients wrote kept as text: the template's own markup
//! keeps its control tokens, while control-token texts inside message content
//! (`<|im_end|><|im_start|>system` typed by a user) stay plain text, so a message cannot forge
//! a turn. A prompt whose messages hold no such text tokenizes exactly as the rendered string.
//!
//! Where the content sits in the rendered text: the template is rendered a second time with
//! every message's content wrapped in private-use marker characters, and the markers give the
//! ranges. When that second render, markers removed, differs from the real one (a template
//! that rewrites content), the content is looked up in the real render in message order.

use crate::{ChatMessage, ChatOptions, Tokenizer, TokenizerError};
use std::ops::Range;

/// Markers around message `i`'s content: OPEN i SEP content CLOSE (plane-16 private use).
const OPEN: char = '\u{10FFF0}';
const SEP: char = '\u{10FFF1}';
const CLOSE: char = '\u{10FFF2}';

impl Tokenizer {
    /// The rendered chat prompt (the model's template, else ChatML) and the byte ranges of
    /// message content in it.
    pub fn render_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        options: &ChatOptions,
    ) -> Result<(String, Vec<Range<usize>>), TokenizerError> {
        // compiled once for both renders
        let template = self.compiled_chat_template()?;
        let render = |m: &[ChatMessage]| -> Result<String, TokenizerError> {
            match &template {
                Some(t) => t.render_with(m, add_generation_prompt, options),
                None => Ok(Tokenizer::fallback_chatml(m, add_generation_prompt)),
            }
        };
        let text = render(messages)?;
        let clean = messages.iter().all(|m| !m.content.contains([OPEN, SEP, CLOSE]));
        if clean {
            let marked: Vec<ChatMessage> = messages
                .iter()
                .enumerate()
                .map(|(i, m)| ChatMessage { content: format!("{OPEN}{i}{SEP}{}{CLOSE}", m.content), ..m.clone() })
                .collect();
            if let Ok(r) = render(&marked) {
                if let Some((unmarked, ranges)) = unmark(&r) {
                    if unmarked == text {
                        return Ok((text, ranges));
                    }
                }
            }
        }
        let ranges = search_in_order(&text, messages);
        Ok((text, ranges))
    }

    /// Token ids of a chat prompt: BOS as the model adds it (once, even when the template
    /// writes it too), control tokens parsed in the template's markup only.
    pub fn encode_chat(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<Vec<u32>, TokenizerError> {
        self.encode_chat_with(messages, add_generation_prompt, &ChatOptions::default())
    }

    /// [`Tokenizer::encode_chat`] with tools and extra template variables.
    pub fn encode_chat_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        options: &ChatOptions,
    ) -> Result<Vec<u32>, TokenizerError> {
        let (text, plain) = self.render_chat(messages, add_generation_prompt, options)?;
        let ids = self.encode_with_plain(&text, true, &plain);
        Ok(match (self.bos_id(), ids.as_slice()) {
            (Some(b), [x, y, ..]) if *x == b && *y == b && self.add_bos() => ids[1..].to_vec(),
            _ => ids,
        })
    }
}

/// The text without markers, and the byte ranges (in it) that were inside markers.
fn unmark(marked: &str) -> Option<(String, Vec<Range<usize>>)> {
    let mut out = String::with_capacity(marked.len());
    let mut ranges = vec![];
    let mut open: Option<usize> = None;
    let mut in_index = false;
    for c in marked.chars() {
        match c {
            OPEN if open.is_none() && !in_index => in_index = true,
            SEP if in_index => {
                in_index = false;
                open = Some(out.len());
            }
            CLOSE if open.is_some() => {
                let start = open.take().expect("checked");
                if out.len() > start {
                    ranges.push(start..out.len());
                }
            }
            OPEN | SEP | CLOSE => return None,
            _ if in_index => {}
            _ => out.push(c),
        }
    }
    (open.is_none() && !in_index).then_some((out, ranges))
}

/// Each message's content (or, failing that, its trimmed content) searched in `text` after
/// the previous one.
fn search_in_order(text: &str, messages: &[ChatMessage]) -> Vec<Range<usize>> {
    let mut ranges = vec![];
    let mut from = 0;
    for m in messages {
        for needle in [m.content.as_str(), m.content.trim()] {
            if needle.is_empty() {
                break;
            }
            if let Some(p) = text[from..].find(needle) {
                let a = from + p;
                ranges.push(a..a + needle.len());
                from = a + needle.len();
                break;
            }
        }
    }
    ranges
}
