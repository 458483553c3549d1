//! GPT-OSS's harmony output, split as it streams: every message opens with a header
//! (`<|channel|>CHANNEL`, optionally ` to=functions.NAME` and `<|constrain|>json`) and its body
//! follows `<|message|>` up to `<|end|>` (or the end of the output: `<|return|>` and `<|call|>`
//! end generation). The `analysis` channel is reasoning, `final` the answer, `commentary`
//! addressed to a function a tool call (its body the arguments), other `commentary` text the
//! answer's preamble.
//!
//! ```text
//!  <|channel|>analysis<|message|>Let me think.<|end|><|start|>assistant<|channel|>final<|message|>Hi!
//!  └── reasoning ─────────────────────────────────┘                 └── content ───────────────────┘
//!  <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}
//!  └── a call of get_weather with {"city": "Paris"} ─────────────────────────────────────────┘
//! ```

use super::format::ParsedCall;
use super::split::{partial_suffix, push, Piece};
use serde_json::Value;

const START: &str = "<|start|>";
const CHANNEL: &str = "<|channel|>";
const MESSAGE: &str = "<|message|>";
const END: &str = "<|end|>";

/// Where the current message's body goes.
#[derive(Clone, Debug, PartialEq)]
enum Body {
    Reasoning,
    Content,
    /// Arguments of a call of this tool.
    Call(String),
}

/// The harmony splitter of one choice.
#[derive(Debug)]
pub struct Harmony {
    /// The tools the request offers (calls of others are shown as content).
    names: Vec<String>,
    /// None: reading a header.
    body: Option<Body>,
    held: String,
    /// The call being read (its tool) and its arguments so far.
    call: Option<(String, String)>,
    calls: Vec<ParsedCall>,
}

impl Harmony {
    pub fn new(names: Vec<String>) -> Harmony {
        Harmony { names, body: None, held: String::new(), call: None, calls: vec![] }
    }

    /// Feed generated text; appends to `out` what may be sent now.
    pub fn push(&mut self, text: &str, out: &mut Vec<Piece>) {
        self.held.push_str(text);
        loop {
            let Some(body) = self.body.clone() else {
                let t = self.held.trim_start().to_string();
                if let Some(p) = t.find(MESSAGE) {
                    let body = self.header_body(&t[..p], out);
                    self.held = t[p + MESSAGE.len()..].to_string();
                    self.body = Some(body);
                    continue;
                }
                // a model that writes no header at all: its text is the answer
                if !t.is_empty() && !t.starts_with("<|") && !START.starts_with(&t) && !CHANNEL.starts_with(&t) {
                    self.held = t;
                    self.body = Some(Body::Content);
                    continue;
                }
                return;
            };
            match [END, START].iter().filter_map(|m| self.held.find(m).map(|p| (p, m.len()))).min() {
                Some((p, n)) => {
                    let text: String = self.held[..p].to_string();
                    self.held.drain(..p + n);
                    self.emit(&body, text, out);
                    self.body = None;
                }
                None => {
                    let keep = partial_suffix(&self.held, END).max(partial_suffix(&self.held, START));
                    let text: String = self.held.drain(..self.held.len() - keep).collect();
                    self.emit(&body, text, out);
                    return;
                }
            }
        }
    }

    /// The output ended: appends what is left to `tail`; returns the calls.
    pub fn finish(mut self, tail: &mut Vec<Piece>) -> Vec<ParsedCall> {
        let held = std::mem::take(&mut self.held);
        // an unfinished header is not shown
        if let Some(body) = self.body.clone() {
            self.emit(&body, held, tail);
        }
        self.close_call(tail);
        self.calls
    }

    /// What the message with this header is (a call read before it is complete now).
    fn header_body(&mut self, header: &str, out: &mut Vec<Piece>) -> Body {
        self.close_call(out);
        let channel = header.split(CHANNEL).nth(1).and_then(|c| c.split_whitespace().next()).unwrap_or("final");
        // ` to=functions.NAME` may stand before or after the channel, `<|constrain|>` after it
        let recipient = header.split_whitespace().find_map(|w| w.strip_prefix("to=")).map(|r| r.split("<|").next().unwrap_or(r));
        let channel = channel.split("<|").next().unwrap_or(channel);
        match (channel, recipient.and_then(|r| r.strip_prefix("functions."))) {
            (_, Some(name)) if self.names.iter().any(|n| n == name) => Body::Call(name.to_string()),
            ("analysis", _) => Body::Reasoning,
            _ => Body::Content,
        }
    }

    fn emit(&mut self, body: &Body, text: String, out: &mut Vec<Piece>) {
        match body {
            Body::Reasoning => push(out, Piece::Reasoning(text)),
            Body::Content => push(out, Piece::Content(text)),
            Body::Call(name) => match &mut self.call {
                Some((n, args)) if n == name => args.push_str(&text),
                _ => {
                    self.close_call(out);
                    self.call = Some((name.clone(), text));
                }
            },
        }
    }

    /// The call read so far, parsed; arguments that are not JSON are shown as content.
    fn close_call(&mut self, out: &mut Vec<Piece>) {
        let Some((name, args)) = self.call.take() else { return };
        let args = args.trim();
        match serde_json::from_str::<Value>(if args.is_empty() { "{}" } else { args }) {
            Ok(arguments) => self.calls.push(ParsedCall { name, arguments }),
            Err(_) => push(out, Piece::Content(args.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(chunks: &[&str], names: &[&str]) -> (String, String, Vec<ParsedCall>) {
        let mut h = Harmony::new(names.iter().map(|s| s.to_string()).collect());
        let mut pieces = vec![];
        for c in chunks {
            h.push(c, &mut pieces);
        }
        let calls = h.finish(&mut pieces);
        let (mut content, mut reasoning) = (String::new(), String::new());
        for p in pieces {
            match p {
                Piece::Content(t) => content.push_str(&t),
                Piece::Reasoning(t) => reasoning.push_str(&t),
            }
        }
        (content, reasoning, calls)
    }

    /// Every cut of the text into two chunks gives the same split.
    fn every_cut(text: &str, names: &[&str]) -> (String, String, Vec<ParsedCall>) {
        let whole = split(&[text], names);
        for i in (1..text.len()).filter(|&i| text.is_char_boundary(i)) {
            assert_eq!(split(&[&text[..i], &text[i..]], names), whole, "cut at {i}");
        }
        whole
    }

    #[test]
    fn analysis_then_final() {
        let t = "<|channel|>analysis<|message|>The user greets.<|end|><|start|>assistant<|channel|>final<|message|>Hello there!";
        let (content, reasoning, calls) = every_cut(t, &[]);
        assert_eq!((content.as_str(), reasoning.as_str()), ("Hello there!", "The user greets."));
        assert!(calls.is_empty());
    }

    #[test]
    fn a_call_after_reasoning() {
        let t = "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather                  <|constrain|>json<|message|>{\"city\": \"Paris\"}";
        let (content, reasoning, calls) = every_cut(t, &["get_weather"]);
        assert_eq!(content, "");
        assert_eq!(reasoning, "Need weather.");
        assert_eq!(calls, vec![ParsedCall { name: "get_weather".into(), arguments: serde_json::json!({"city": "Paris"}) }]);
        // the recipient before the channel, as the template writes earlier calls
        let t = "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{}";
        assert_eq!(every_cut(t, &["get_weather"]).2, vec![ParsedCall { name: "get_weather".into(), arguments: serde_json::json!({}) }]);
    }

    #[test]
    fn unknown_tools_bad_arguments_and_plain_text_are_content() {
        let t = "<|channel|>commentary to=functions.other<|message|>{\"a\": 1}";
        assert_eq!(every_cut(t, &["get_weather"]).0, "{\"a\": 1}");
        let t = "<|channel|>commentary to=functions.get_weather<|message|>{not json";
        let (content, _, calls) = every_cut(t, &["get_weather"]);
        assert_eq!((content.as_str(), calls.len()), ("{not json", 0));
        assert_eq!(every_cut("Just text.", &[]).0, "Just text.");
        // a header cut off by the length limit shows nothing
        assert_eq!(split(&["<|channel|>fin"], &[]), (String::new(), String::new(), vec![]));
    }
}
