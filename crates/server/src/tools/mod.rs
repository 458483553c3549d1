//! Tool calling and reasoning in chat requests: the request's `tools` and `tool_choice`
//! read and checked, the prompt and the output constraint fitted to the model's tool call
//! format (its template's, or a generic JSON one), and the output split back into content,
//! reasoning and tool calls.
//!
//! | module   | responsibility |
//! |----------|----------------|
//! | `format` | the families' tool call formats: detection, forcing grammar, parser |
//! | `split`  | streamed output -> content / reasoning pieces and parsed calls |
//! | `harmony`| GPT-OSS's channels -> content / reasoning pieces and parsed calls |

mod format;
mod harmony;
mod split;
#[cfg(test)]
mod tests;

pub use format::{ParsedCall, ToolFormat};
pub use split::{Outcome, Piece, Splitter};

use crate::error::ApiError;
use quarrel_engine::ConstraintSpec;
use quarrel_tokenizer::{ChatMessage, ChatOptions, Tokenizer};
use serde_json::{json, Value};

/// Most tools one request may offer.
const MAX_TOOLS: usize = 128;

/// Whether and how the model may call tools.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolChoice {
    Auto,
    None,
    Required,
    Named(String),
}

/// The tools a request offers, checked.
#[derive(Clone, Debug)]
pub struct ToolRequest {
    /// `{type: "function", function: {name, description?, parameters?}}` each.
    pub tools: Vec<Value>,
    pub choice: ToolChoice,
    pub parallel: bool,
}

impl ToolRequest {
    /// From OpenAI's `tools`, `tool_choice` and `parallel_tool_calls` (ollama sends the same
    /// `tools` shape and no choice). No tools: `None`.
    pub fn read(tools: Option<Vec<Value>>, choice: Option<&Value>, parallel: Option<bool>) -> Result<Option<ToolRequest>, ApiError> {
        let tools = tools.unwrap_or_default();
        let choice = match choice {
            None => ToolChoice::Auto,
            Some(Value::String(s)) => match s.as_str() {
                "auto" => ToolChoice::Auto,
                "none" => ToolChoice::None,
                "required" => ToolChoice::Required,
                other => return Err(ApiError::invalid(format!("tool_choice must be auto, none, required or a function, got {other:?}"))),
            },
            Some(v) => match v.pointer("/function/name").and_then(Value::as_str) {
                Some(name) => ToolChoice::Named(name.to_string()),
                None => {
                    return Err(ApiError::invalid(
                        "tool_choice must be auto, none, required or {\"type\": \"function\", \"function\": {\"name\": ..}}",
                    ))
                }
            },
        };
        if tools.is_empty() {
            return match choice {
                ToolChoice::Auto | ToolChoice::None => Ok(None),
                _ => Err(ApiError::invalid("tool_choice asks for a tool call but no tools are given")),
            };
        }
        if tools.len() > MAX_TOOLS {
            return Err(ApiError::invalid(format!("at most {MAX_TOOLS} tools")));
        }
        let mut names: Vec<&str> = vec![];
        for (i, t) in tools.iter().enumerate() {
            if t.get("type").and_then(Value::as_str).is_some_and(|ty| ty != "function") {
                return Err(ApiError::invalid(format!("tools[{i}]: only function tools are supported")));
            }
            let f = t.get("function").ok_or_else(|| ApiError::invalid(format!("tools[{i}] has no function")))?;
            let name = f.get("name").and_then(Value::as_str).filter(|n| !n.is_empty());
            let name = name.ok_or_else(|| ApiError::invalid(format!("tools[{i}].function needs a name")))?;
            if names.contains(&name) {
                return Err(ApiError::invalid(format!("tools[{i}]: the name {name:?} is used twice")));
            }
            match f.get("parameters") {
                None | Some(Value::Object(_)) => {}
                Some(_) => return Err(ApiError::invalid(format!("tools[{i}].function.parameters must be a JSON schema object"))),
            }
            names.push(name);
        }
        if let ToolChoice::Named(n) = &choice {
            if !names.contains(&n.as_str()) {
                return Err(ApiError::invalid(format!("tool_choice names {n:?}, which is not among the tools")));
            }
        }
        Ok(Some(ToolRequest { tools, choice, parallel: parallel.unwrap_or(true) }))
    }

    fn name(tool: &Value) -> &str {
        tool.pointer("/function/name").and_then(Value::as_str).unwrap_or_default()
    }
}

/// How one request's output is read back, decided with the model.
#[derive(Clone, Debug, Default)]
pub struct ChatPlan {
    /// The tool call format and the names of the tools offered (None: no calls expected).
    pub tools: Option<(ToolFormat, Vec<String>)>,
    /// The output may open with reasoning in `<think>` tags.
    pub think: bool,
    /// The output is harmony's channels (GPT-OSS): reasoning and calls in their own messages.
    pub harmony: bool,
}

impl ChatPlan {
    /// Whether the output needs splitting at all.
    pub fn active(&self) -> bool {
        self.tools.is_some() || self.think || self.harmony
    }

    pub fn splitter(&self) -> Splitter {
        if self.harmony {
            return Splitter::harmony(self.tools.as_ref().map(|(_, n)| n.clone()).unwrap_or_default());
        }
        Splitter::new(self.tools.clone(), self.think)
    }

    /// Mistral's templates require call ids of nine letters and digits.
    pub fn call_id(&self) -> String {
        let id = uuid::Uuid::new_v4().simple().to_string();
        match &self.tools {
            Some((ToolFormat::Mistral, _)) => id[..9].to_string(),
            _ => format!("call_{}", &id[..24]),
        }
    }
}

/// Fit the conversation to the model: tools passed to its template (or described in the
/// system message when it has no tool support), earlier calls and results written as the
/// format expects, and a grammar that forces a call when `tool_choice` asks for one.
pub fn plan(
    tok: &Tokenizer,
    req: Option<&ToolRequest>,
    messages: &mut Vec<ChatMessage>,
    options: &mut ChatOptions,
    constraint: &mut Option<ConstraintSpec>,
) -> Result<ChatPlan, ApiError> {
    let template = tok.chat_template();
    let format = ToolFormat::detect(template);
    let thinking_off = options.kwargs.get("enable_thinking").is_some_and(|v| v == &Value::Bool(false));
    let think = template.is_some_and(|t| t.contains("<think>")) && !thinking_off;
    let harmony = format == ToolFormat::Harmony;
    if !format.native() {
        write_history_as_json(messages);
    }
    let Some(req) = req.filter(|r| r.choice != ToolChoice::None) else {
        return Ok(ChatPlan { tools: None, think, harmony });
    };
    let offered: Vec<Value> = match &req.choice {
        ToolChoice::Named(n) => req.tools.iter().filter(|t| ToolRequest::name(t) == n).cloned().collect(),
        _ => req.tools.clone(),
    };
    let forced = req.choice != ToolChoice::Auto;
    if forced || !format.native() {
        if constraint.is_some() {
            return Err(ApiError::invalid("a structured output format cannot be combined with tool calls on this model"));
        }
        // a named function is one call of it, as OpenAI answers it
        let parallel = req.parallel && !matches!(req.choice, ToolChoice::Named(_));
        *constraint = Some(ConstraintSpec::Lark(format.grammar(tok, &offered, parallel, !forced)));
    }
    if format.native() {
        options.tools = Some(Value::Array(req.tools.clone()));
    } else {
        let text = format::generic_instructions(&offered, !forced);
        match messages.first_mut() {
            Some(m) if m.role == "system" => m.content = format!("{}\n\n{text}", m.content),
            _ => messages.insert(0, ChatMessage::system(text)),
        }
    }
    let names = offered.iter().map(|t| ToolRequest::name(t).to_string()).collect();
    Ok(ChatPlan { tools: Some((format, names)), think, harmony })
}

/// For templates without tool support: earlier calls become the JSON the generic format
/// answers with, and tool results become user turns (which keeps the turns alternating for
/// templates that insist on it).
fn write_history_as_json(messages: &mut [ChatMessage]) {
    for m in messages.iter_mut() {
        if !m.tool_calls.is_empty() {
            let calls: Vec<Value> = m.tool_calls.iter().map(|c| json!({"name": c.name, "arguments": c.arguments})).collect();
            m.content = format::spaced_json(&json!({"tool_calls": calls}));
            m.tool_calls.clear();
        } else if m.role == "tool" {
            let mut r = json!({"content": m.content});
            if let Some(n) = m.name.take() {
                r["name"] = json!(n);
            }
            if let Some(id) = m.tool_call_id.take() {
                r["id"] = json!(id);
            }
            m.role = "user".into();
            m.content = format::spaced_json(&json!({"tool_response": r}));
        }
    }
}

/// A whole output, split.
#[derive(Debug, Default, PartialEq)]
pub struct Reply {
    pub content: String,
    pub reasoning: String,
    pub calls: Vec<ParsedCall>,
}

impl ChatPlan {
    /// Split a finished output (text passes as content when there is nothing to split).
    pub fn reply(&self, text: &str) -> Reply {
        if !self.active() {
            return Reply { content: text.to_string(), ..Default::default() };
        }
        let mut s = self.splitter();
        let pieces = s.push(text);
        Reply::gather(pieces, s.finish())
    }
}

impl Reply {
    /// The pieces streamed so far and what the end gave, as one reply.
    pub fn gather(pieces: Vec<Piece>, end: Outcome) -> Reply {
        let mut r = Reply { calls: end.calls, ..Default::default() };
        for p in pieces.into_iter().chain(end.tail) {
            match p {
                Piece::Content(t) => r.content.push_str(&t),
                Piece::Reasoning(t) => r.reasoning.push_str(&t),
            }
        }
        r
    }
}
