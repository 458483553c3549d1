//! Generated text split, as it streams, into what the client sees apart: the answer
//! (`content`), the reasoning (`<think>..</think>`, or harmony's analysis channel:
//! `reasoning_content` / ollama `thinking`) and tool calls (held back until complete, then
//! parsed). Text that might open a marker is held until it is known not to, so no marker
//! reaches the client as content.

use super::format::{generic_response, ParsedCall, ToolFormat};
use super::harmony::Harmony;

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";
/// How the generic format's direct answer begins (the grammar's fixed JSON layout).
const RESPONSE_OPEN: &str = "{\"response\": \"";

/// A piece of streamed output.
#[derive(Clone, Debug, PartialEq)]
pub enum Piece {
    Content(String),
    Reasoning(String),
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
    /// Nothing decided yet: reasoning, a call or an answer may begin.
    Start,
    Reasoning,
    Content,
    /// Inside tool calls: everything is held for the parser.
    Call,
    /// The generic format's JSON, before it is known to be an answer or calls.
    Json,
    /// Inside the generic format's `"response"` string.
    JsonString,
    /// After the generic answer's closing quote.
    Done,
}

/// The splitter of one choice.
pub struct Splitter {
    /// Harmony output (GPT-OSS): its own splitter.
    harmony: Option<Harmony>,
    tools: Option<(ToolFormat, Vec<String>)>,
    think: bool,
    phase: Phase,
    held: String,
    call: String,
}

/// What the output held once it ended.
#[derive(Debug, Default, PartialEq)]
pub struct Outcome {
    /// Pieces not streamed before the end.
    pub tail: Vec<Piece>,
    pub calls: Vec<ParsedCall>,
}

impl Splitter {
    /// `tools`: the format and the names of the tools the request offers (None: no tools).
    /// `think`: the output may open with `<think>`.
    pub fn new(tools: Option<(ToolFormat, Vec<String>)>, think: bool) -> Splitter {
        // plain text passes untouched (the start phase trims leading whitespace)
        let phase = if tools.is_none() && !think { Phase::Content } else { Phase::Start };
        Splitter { harmony: None, tools, think, phase, held: String::new(), call: String::new() }
    }

    /// A splitter of harmony output; `names`: the tools the request offers.
    pub fn harmony(names: Vec<String>) -> Splitter {
        Splitter { harmony: Some(Harmony::new(names)), ..Splitter::new(None, false) }
    }

    fn format(&self) -> Option<ToolFormat> {
        self.tools.as_ref().map(|(f, _)| *f)
    }

    /// Feed generated text; returns what may be sent now.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        let mut out = vec![];
        if let Some(h) = &mut self.harmony {
            h.push(text, &mut out);
            return merge(out);
        }
        self.held.push_str(text);
        loop {
            let before = (self.phase, self.held.len());
            self.step(&mut out);
            if (self.phase, self.held.len()) == before {
                break;
            }
        }
        merge(out)
    }

    fn step(&mut self, out: &mut Vec<Piece>) {
        match self.phase {
            Phase::Start => {
                let t = self.held.trim_start();
                if t.is_empty() {
                    return;
                }
                if self.think {
                    if let Some(rest) = t.strip_prefix(THINK_OPEN) {
                        self.held = rest.to_string();
                        self.phase = Phase::Reasoning;
                        return;
                    }
                    if THINK_OPEN.starts_with(t) {
                        return;
                    }
                }
                match self.format() {
                    Some(ToolFormat::Generic) => {
                        self.held = t.to_string();
                        self.phase = Phase::Json;
                    }
                    Some(ToolFormat::Llama3) if t.starts_with('{') || t.starts_with("<|python_tag|>") => {
                        self.held = t.to_string();
                        self.phase = Phase::Call;
                    }
                    Some(ToolFormat::Llama3) if "<|python_tag|>".starts_with(t) => {}
                    _ => {
                        self.held = t.to_string();
                        self.phase = Phase::Content;
                    }
                }
            }
            Phase::Reasoning => {
                if let Some(p) = self.held.find(THINK_CLOSE) {
                    push(out, Piece::Reasoning(self.held[..p].to_string()));
                    self.held = self.held[p + THINK_CLOSE.len()..].to_string();
                    // after the reasoning a call or an answer may begin, as at the start
                    self.think = false;
                    self.phase = Phase::Start;
                } else {
                    let keep = partial_suffix(&self.held, THINK_CLOSE);
                    let send = self.held[..self.held.len() - keep].to_string();
                    self.held.drain(..send.len());
                    push(out, Piece::Reasoning(send));
                }
            }
            Phase::Content => {
                let trigger = self.format().and_then(ToolFormat::trigger);
                match trigger.and_then(|t| self.held.find(t)) {
                    Some(p) => {
                        push(out, Piece::Content(self.held[..p].to_string()));
                        self.call = self.held[p..].to_string();
                        self.held.clear();
                        self.phase = Phase::Call;
                    }
                    None => {
                        let keep = trigger.map_or(0, |t| partial_suffix(&self.held, t));
                        let send = self.held[..self.held.len() - keep].to_string();
                        self.held.drain(..send.len());
                        push(out, Piece::Content(send));
                    }
                }
            }
            Phase::Call => {
                self.call.push_str(&self.held);
                self.held.clear();
            }
            Phase::Json => {
                if let Some(rest) = self.held.strip_prefix(RESPONSE_OPEN) {
                    self.held = rest.to_string();
                    self.phase = Phase::JsonString;
                } else if !RESPONSE_OPEN.starts_with(self.held.as_str()) {
                    self.call.push_str(&self.held);
                    self.held.clear();
                    self.phase = Phase::Call;
                }
            }
            Phase::JsonString => {
                let (text, used, closed) = json_string_prefix(&self.held);
                self.held.drain(..used);
                push(out, Piece::Content(text));
                if closed {
                    self.phase = Phase::Done;
                }
            }
            Phase::Done => self.held.clear(),
        }
    }

    /// The output ended: what is left, and the calls.
    pub fn finish(mut self) -> Outcome {
        let mut tail = vec![];
        if let Some(h) = self.harmony.take() {
            let calls = h.finish(&mut tail);
            return Outcome { tail: merge(tail), calls };
        }
        let held = std::mem::take(&mut self.held);
        match self.phase {
            Phase::Start | Phase::Content => push(&mut tail, Piece::Content(held)),
            Phase::Reasoning => push(&mut tail, Piece::Reasoning(held)),
            Phase::Json => push(&mut tail, Piece::Content(held)),
            Phase::JsonString => push(&mut tail, Piece::Content(json_string_prefix(&held).0)),
            Phase::Done => {}
            Phase::Call => {
                let (format, names) = self.tools.as_ref().expect("calls only with tools");
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                match format.parse(&self.call, &names) {
                    Some((rest, calls)) => {
                        push(&mut tail, Piece::Content(rest));
                        return Outcome { tail, calls };
                    }
                    None => {
                        let text = match format {
                            ToolFormat::Generic => generic_response(&self.call).unwrap_or(self.call),
                            _ => self.call,
                        };
                        push(&mut tail, Piece::Content(text));
                    }
                }
            }
        }
        Outcome { tail, calls: vec![] }
    }
}

pub(super) fn push(out: &mut Vec<Piece>, p: Piece) {
    let empty = match &p {
        Piece::Content(s) | Piece::Reasoning(s) => s.is_empty(),
    };
    if !empty {
        out.push(p);
    }
}

/// Adjacent pieces of one kind joined.
fn merge(pieces: Vec<Piece>) -> Vec<Piece> {
    let mut out: Vec<Piece> = vec![];
    for p in pieces {
        match (out.last_mut(), p) {
            (Some(Piece::Content(a)), Piece::Content(b)) | (Some(Piece::Reasoning(a)), Piece::Reasoning(b)) => a.push_str(&b),
            (_, p) => out.push(p),
        }
    }
    out
}

/// The length of the longest suffix of `s` that is a proper prefix of `marker`.
pub(super) fn partial_suffix(s: &str, marker: &str) -> usize {
    (1..marker.len().min(s.len() + 1))
        .rev()
        .find(|&n| s.is_char_boundary(s.len() - n) && marker.starts_with(&s[s.len() - n..]))
        .unwrap_or(0)
}

/// Decode the start of a JSON string body (after its opening quote): the text decoded so
/// far, the bytes used, and whether the closing quote was reached. An escape cut off at the
/// end is left for later.
fn json_string_prefix(s: &str) -> (String, usize, bool) {
    let b = s.as_bytes();
    let mut out = String::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'"' => return (out, i + 1, true),
            b'\\' => {
                let Some(&e) = b.get(i + 1) else { break };
                let simple = match e {
                    b'"' => Some('"'),
                    b'\\' => Some('\\'),
                    b'/' => Some('/'),
                    b'b' => Some('\u{8}'),
                    b'f' => Some('\u{c}'),
                    b'n' => Some('\n'),
                    b'r' => Some('\r'),
                    b't' => Some('\t'),
                    _ => None,
                };
                if let Some(c) = simple {
                    out.push(c);
                    i += 2;
                    continue;
                }
                if e != b'u' {
                    // not valid JSON; shown as written
                    out.push('\\');
                    i += 1;
                    continue;
                }
                let Some(hi) = hex4(s, i + 2) else { break };
                if (0xD800..0xDC00).contains(&hi) {
                    // a surrogate pair: both halves needed
                    if s.len() < i + 12 {
                        break;
                    }
                    let lo = if s.get(i + 6..i + 8) == Some("\\u") { hex4(s, i + 8) } else { None };
                    match lo.filter(|l| (0xDC00..0xE000).contains(l)) {
                        Some(lo) => {
                            out.extend(char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)));
                            i += 12;
                        }
                        None => {
                            out.push('\u{FFFD}');
                            i += 6;
                        }
                    }
                } else {
                    out.push(char::from_u32(hi).unwrap_or('\u{FFFD}'));
                    i += 6;
                }
            }
            _ => {
                let ch = s[i..].chars().next().expect("inside the string");
                out.push(ch);
                i += ch.len_utf8();
            }
        }
    }
    (out, i, false)
}

fn hex4(s: &str, at: usize) -> Option<u32> {
    s.get(at..at + 4).and_then(|h| u32::from_str_radix(h, 16).ok())
}
