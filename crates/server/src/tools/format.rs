//! How a model family writes tool calls, chosen from its chat template: the grammar that
//! forces a call (`tool_choice` `required` or a named function) and the parser that finds the
//! calls in generated text.
//!
//! | format  | template mentions | a call is written as |
//! |---------|-------------------|----------------------|
//! | Hermes  | `<tool_call>` (Qwen 2.5 / 3, Hermes, SmolLM3) | `<tool_call>\n{"name": .., "arguments": {..}}\n</tool_call>` per call |
//! | Mistral | `[TOOL_CALLS]` | `[TOOL_CALLS][{"name": .., "arguments": {..}}, ..]` |
//! | Granite | `<\|tool_call\|>` | `<\|tool_call\|>[{"name": .., "arguments": {..}}, ..]` |
//! | Llama 3 | `<\|python_tag\|>` or "parameters" with tools (Llama 3.1 / 3.2 / 3.3) | `{"name": .., "parameters": {..}}` |
//! | Harmony | `<\|channel\|>` (GPT-OSS) | `<\|channel\|>commentary to=functions.NAME <\|constrain\|>json<\|message\|>{..}` (see `harmony`) |
//! | Generic | nothing of the above | the tools are described in the system message and the whole answer is JSON: `{"tool_calls": [..]}` or `{"response": ".."}` |

use quarrel_tokenizer::Tokenizer;
use serde_json::{json, Map, Value};

/// A tool call format (see the module table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    Hermes,
    Mistral,
    Granite,
    Llama3,
    Harmony,
    Generic,
}

/// A call found in generated text, before ids are given.
#[derive(Clone, Debug, PartialEq)]
pub struct ParsedCall {
    pub name: String,
    pub arguments: Value,
}

impl ToolFormat {
    /// The format the chat template (None: the model has none) writes tool calls in.
    pub fn detect(template: Option<&str>) -> ToolFormat {
        let Some(t) = template else { return ToolFormat::Generic };
        // harmony's channels carry the reasoning too: with or without tools
        if t.contains("<|channel|>") {
            return ToolFormat::Harmony;
        }
        if !t.contains("tools") {
            return ToolFormat::Generic;
        }
        if t.contains("<tool_call>") {
            ToolFormat::Hermes
        } else if t.contains("[TOOL_CALLS]") {
            ToolFormat::Mistral
        } else if t.contains("<|tool_call|>") {
            ToolFormat::Granite
        } else if t.contains("<|python_tag|>") || (t.contains("<|start_header_id|>") && t.contains("parameters")) {
            ToolFormat::Llama3
        } else {
            ToolFormat::Generic
        }
    }

    /// Whether the template renders the tools itself (else they go into the system message).
    pub fn native(self) -> bool {
        self != ToolFormat::Generic
    }

    /// The text that opens a call in free text (None: the format has no marker).
    pub fn trigger(self) -> Option<&'static str> {
        match self {
            ToolFormat::Hermes => Some("<tool_call>"),
            ToolFormat::Mistral => Some("[TOOL_CALLS]"),
            ToolFormat::Granite => Some("<|tool_call|>"),
            ToolFormat::Llama3 | ToolFormat::Harmony | ToolFormat::Generic => None,
        }
    }

    /// A Lark grammar (llguidance's dialect) whose every sentence is a call of one of `tools`
    /// (one or more calls when `parallel`); in the generic format, with `allow_text`, a
    /// direct answer is allowed too.
    pub fn grammar(self, tok: &Tokenizer, tools: &[Value], parallel: bool, allow_text: bool) -> String {
        let call = |args_key: &str| Value::Object(call_schema(tools, args_key));
        let max_calls = if parallel { MAX_CALLS } else { 1 };
        match self {
            ToolFormat::Hermes => {
                let open = literal(tok, "<tool_call>");
                let close = literal(tok, "</tool_call>");
                let more = if parallel { format!(" (\"\\n\" call){{0,{}}}", MAX_CALLS - 1) } else { String::new() };
                format!("start: call{more}\ncall: {open} \"\\n\" %json {} \"\\n\" {close}\n", laid_out(call("arguments")))
            }
            ToolFormat::Mistral | ToolFormat::Granite => {
                let open = literal(tok, self.trigger().unwrap_or_default());
                let list = laid_out(json!({"type": "array", "items": call("arguments"), "minItems": 1, "maxItems": max_calls}));
                format!("start: {open} %json {list}\n")
            }
            ToolFormat::Llama3 => format!("start: %json {}\n", laid_out(call("parameters"))),
            ToolFormat::Harmony => {
                // one call (harmony ends the turn with it), straight after the generation prompt
                let (channel, constrain, message) =
                    (literal(tok, "<|channel|>"), literal(tok, "<|constrain|>"), literal(tok, "<|message|>"));
                let one = |t: &Value| {
                    let name = t.pointer("/function/name").and_then(Value::as_str).unwrap_or_default();
                    let params = t.pointer("/function/parameters").cloned().unwrap_or_else(|| json!({"type": "object"}));
                    let to = serde_json::to_string(&format!("commentary to=functions.{name} ")).unwrap_or_default();
                    format!("{channel} {to} {constrain} \"json\" {message} %json {}", laid_out(params))
                };
                format!("start: {}\n", tools.iter().map(one).collect::<Vec<_>>().join("\n     | "))
            }
            ToolFormat::Generic => {
                let calls = json!({"type": "object", "properties": {"tool_calls": {"type": "array", "items": call("arguments"), "minItems": 1,
                    "maxItems": max_calls}}, "required": ["tool_calls"], "additionalProperties": false});
                let schema = if allow_text {
                    let text = json!({"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"], "additionalProperties": false});
                    json!({"anyOf": [calls, text]})
                } else {
                    calls
                };
                format!("start: %json {}\n", laid_out(schema))
            }
        }
    }

    /// The calls in `text` and the text around them; no calls found: `None`. Calls of tools
    /// not in `names` are not calls (the text stays content).
    pub fn parse(self, text: &str, names: &[&str]) -> Option<(String, Vec<ParsedCall>)> {
        let calls_and_rest = match self {
            ToolFormat::Hermes => parse_tagged(text, "<tool_call>", "</tool_call>"),
            ToolFormat::Mistral | ToolFormat::Granite => {
                let trigger = self.trigger().unwrap_or_default();
                // the marker may be a control token the detokenizer does not write
                let (before, after) = match text.find(trigger) {
                    Some(p) => (&text[..p], &text[p + trigger.len()..]),
                    None if text.trim_start().starts_with('[') => ("", text),
                    None => return None,
                };
                let calls = parse_list(after.trim())?;
                Some((before.trim().to_string(), calls))
            }
            ToolFormat::Llama3 => {
                let body = text.trim().trim_start_matches("<|python_tag|>").trim();
                let v: Value = serde_json::from_str(body).ok()?;
                Some((String::new(), vec![call_from(&v)?]))
            }
            // the harmony splitter reads the calls as they stream
            ToolFormat::Harmony => None,
            ToolFormat::Generic => {
                let t = text.trim();
                let calls = match serde_json::from_str::<Value>(t) {
                    Ok(v) => match v.get("tool_calls").or_else(|| v.get("tool_call"))? {
                        Value::Array(items) => items.iter().map(call_from).collect::<Option<Vec<_>>>()?,
                        one => vec![call_from(one)?],
                    },
                    // cut off by the length limit inside the list
                    Err(_) => list_prefix(t.strip_prefix("{\"tool_calls\":")?.trim_start())?,
                };
                Some((String::new(), calls))
            }
        }?;
        let (rest, calls) = calls_and_rest;
        (!calls.is_empty() && calls.iter().all(|c| names.contains(&c.name.as_str()))).then_some((rest, calls))
    }
}

/// Most calls in one answer.
const MAX_CALLS: usize = 16;

/// `schema` with the compact JSON layout (`", "`, `": "`, no other whitespace) that the
/// structured-output grammars use: small models otherwise pad calls with newlines.
fn laid_out(mut schema: Value) -> Value {
    if let Value::Object(m) = &mut schema {
        m.insert("x-guidance".into(), json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}));
    }
    schema
}

/// The generic format's direct answer (`{"response": ".."}`), if `text` is one.
pub fn generic_response(text: &str) -> Option<String> {
    let v: Value = serde_json::from_str(text.trim()).ok()?;
    v.get("response")?.as_str().map(str::to_string)
}

/// The system-message text that describes the tools to a model whose template does not.
pub fn generic_instructions(tools: &[Value], allow_text: bool) -> String {
    let list: Vec<&Value> = tools.iter().map(|t| t.get("function").unwrap_or(t)).collect();
    let listing = serde_json::to_string_pretty(&list).unwrap_or_default();
    let answer = if allow_text {
        "Respond with a JSON object: {\"tool_calls\": [{\"name\": <tool name>, \"arguments\": {<arguments>}}]} to call tools, \
         or {\"response\": <your answer>} to answer directly."
    } else {
        "Respond with a JSON object that calls tools: {\"tool_calls\": [{\"name\": <tool name>, \"arguments\": {<arguments>}}]}."
    };
    format!("You can use these tools:\n{listing}\n\n{answer}")
}

/// `{"name": <one of the tools>, args_key: <its parameters>}` as a JSON schema.
fn call_schema(tools: &[Value], args_key: &str) -> Map<String, Value> {
    let one = |t: &Value| {
        let f = t.get("function").unwrap_or(t);
        let params = match f.get("parameters") {
            Some(p @ Value::Object(_)) => p.clone(),
            _ => json!({"type": "object"}),
        };
        json!({"type": "object", "properties": {"name": {"const": f.get("name").cloned().unwrap_or(Value::Null)}, args_key: params},
               "required": ["name", args_key], "additionalProperties": false})
    };
    let mut m = Map::new();
    if tools.len() == 1 {
        if let Value::Object(o) = one(&tools[0]) {
            return o;
        }
    }
    m.insert("anyOf".into(), Value::Array(tools.iter().map(one).collect()));
    m
}

/// `s` as a grammar item: the control or user-defined token it names (written `<[id]>`, the
/// token itself rather than text spelling it), else a quoted literal.
fn literal(tok: &Tokenizer, s: &str) -> String {
    let special = |id: &u32| tok.token_attr(*id).is_control() || tok.token_attr(*id).is_user_defined();
    let control = tok.token_id(s).filter(special);
    match control {
        Some(id) => format!("<[{id}]>"),
        None => serde_json::to_string(s).unwrap_or_default(),
    }
}

fn call_from(v: &Value) -> Option<ParsedCall> {
    let name = v.get("name")?.as_str()?.to_string();
    let arguments = match v.get("arguments").or_else(|| v.get("parameters")) {
        Some(Value::String(s)) => serde_json::from_str(s).unwrap_or(Value::String(s.clone())),
        Some(a) => a.clone(),
        None => json!({}),
    };
    Some(ParsedCall { name, arguments })
}

fn parse_list(text: &str) -> Option<Vec<ParsedCall>> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Array(items)) => items.iter().map(call_from).collect(),
        Ok(one) => Some(vec![call_from(&one)?]),
        Err(_) => list_prefix(text),
    }
}

/// The complete calls at the start of a JSON list that was cut off by the length limit
/// (`[{..}, {..}, {"na`): None when not even one is complete.
fn list_prefix(text: &str) -> Option<Vec<ParsedCall>> {
    let mut rest = text.strip_prefix('[')?;
    let mut calls = vec![];
    loop {
        let mut items = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let Some(Ok(v)) = items.next() else { break };
        calls.push(call_from(&v)?);
        rest = rest[items.byte_offset()..].trim_start();
        match rest.strip_prefix(',') {
            Some(r) => rest = r,
            None => break,
        }
    }
    (!calls.is_empty()).then_some(calls)
}

/// Calls between `open` and `close` markers (the last one may lack its `close`: the output
/// ended), and the text outside them.
fn parse_tagged(text: &str, open: &str, close: &str) -> Option<(String, Vec<ParsedCall>)> {
    let mut rest = String::new();
    let mut calls = vec![];
    let mut s = text;
    while let Some(p) = s.find(open) {
        rest.push_str(&s[..p]);
        let body = &s[p + open.len()..];
        let (inner, after, closed) = match body.find(close) {
            Some(q) => (&body[..q], &body[q + close.len()..], true),
            None => (body, "", false),
        };
        match serde_json::from_str::<Value>(inner.trim()).ok().and_then(|v| call_from(&v)) {
            Some(c) => calls.push(c),
            // a call cut off by the length limit: the complete ones before it stand
            None if !closed && !calls.is_empty() => {
                s = "";
                break;
            }
            None => return None,
        }
        s = after;
    }
    rest.push_str(s);
    Some((rest.trim().to_string(), calls))
}

/// JSON in the layout the grammars produce (`", "` and `": "`, no other whitespace), so that
/// earlier turns look like what the model is asked to write.
pub fn spaced_json(v: &Value) -> String {
    struct Spaced;
    impl serde_json::ser::Formatter for Spaced {
        fn begin_array_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
            if first {
                Ok(())
            } else {
                w.write_all(b", ")
            }
        }
        fn begin_object_key<W: ?Sized + std::io::Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
            if first {
                Ok(())
            } else {
                w.write_all(b", ")
            }
        }
        fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
            w.write_all(b": ")
        }
    }
    let mut out = vec![];
    let mut ser = serde_json::Serializer::with_formatter(&mut out, Spaced);
    match serde::Serialize::serialize(v, &mut ser) {
        Ok(()) => String::from_utf8(out).unwrap_or_default(),
        Err(_) => v.to_string(),
    }
}
