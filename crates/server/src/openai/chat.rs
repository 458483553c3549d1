//! `POST /v1/chat/completions`: messages (with earlier tool calls and results) -> the
//! model's answer, its reasoning and its tool calls, whole or as SSE chunks.

use super::{chat_logprob, check_n, request_id, sse_choices, start_n, whole_response, ChoiceEvent, ChunkHead, Generation};
use crate::error::{ApiError, ApiJson};
use crate::gen::{finish_str, unix_now};
use crate::state::AppState;
use crate::tools::{ChatPlan, ParsedCall, Piece, Splitter, ToolRequest};
use axum::extract::State;
use axum::response::Response;
use quarrel_engine::Prompt;
use quarrel_tokenizer::{ChatMessage, ChatOptions, ToolCall};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use utoipa::ToSchema;

/// Message content: text, or a list of parts of which only `text` parts are supported.
#[derive(Deserialize, ToSchema, Debug, Clone)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    #[schema(value_type = Vec<Object>)]
    Parts(Vec<Value>),
}

/// A message as OpenAI and ollama clients send it.
#[derive(Deserialize, ToSchema, Debug, Clone)]
pub struct ChatMessageIn {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
    /// An assistant turn's calls: OpenAI `{id, type, function: {name, arguments: "<json>"}}`,
    /// ollama `{function: {name, arguments: {..}}}`.
    #[schema(value_type = Vec<Object>)]
    pub tool_calls: Option<Vec<Value>>,
    /// On a `tool` message: the call it answers.
    pub tool_call_id: Option<String>,
    /// On a `tool` message: the tool (OpenAI `name`, ollama `tool_name`).
    #[serde(alias = "tool_name")]
    pub name: Option<String>,
    /// An assistant turn's reasoning (OpenAI-style `reasoning_content`, ollama `thinking`).
    #[serde(alias = "thinking")]
    pub reasoning_content: Option<String>,
}

fn content_text(content: Option<Content>) -> Result<String, ApiError> {
    Ok(match content {
        None => String::new(),
        Some(Content::Text(t)) => t,
        Some(Content::Parts(parts)) => {
            let mut s = String::new();
            for p in parts {
                match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => s.push_str(t),
                    (t, _) => return Err(ApiError::invalid(format!("unsupported content part type {t:?}: only text is supported"))),
                }
            }
            s
        }
    })
}

/// A call from a request's history; arguments given as JSON text are parsed.
fn tool_call_in(i: usize, v: &Value) -> Result<ToolCall, ApiError> {
    let f = v.get("function").ok_or_else(|| ApiError::invalid(format!("tool_calls[{i}] has no function")))?;
    let name = f.get("name").and_then(Value::as_str).ok_or_else(|| ApiError::invalid(format!("tool_calls[{i}].function needs a name")))?;
    let arguments = match f.get("arguments") {
        Some(Value::String(s)) => serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.clone())),
        Some(a) => a.clone(),
        None => json!({}),
    };
    let id = v.get("id").and_then(Value::as_str).unwrap_or_default().to_string();
    Ok(ToolCall { id, name: name.to_string(), arguments })
}

pub fn to_chat(msgs: Vec<ChatMessageIn>) -> Result<Vec<ChatMessage>, ApiError> {
    msgs.into_iter()
        .map(|m| {
            if !matches!(m.role.as_str(), "system" | "user" | "assistant" | "tool" | "developer") {
                return Err(ApiError::invalid(format!("unknown message role {:?}", m.role)));
            }
            let role = if m.role == "developer" { "system".to_string() } else { m.role };
            let tool_calls = m.tool_calls.iter().flatten().enumerate().map(|(i, c)| tool_call_in(i, c)).collect::<Result<Vec<_>, _>>()?;
            Ok(ChatMessage {
                role,
                content: content_text(m.content)?,
                tool_calls,
                tool_call_id: m.tool_call_id,
                name: m.name,
                reasoning_content: m.reasoning_content.filter(|r| !r.is_empty()),
            })
        })
        .collect()
}

/// `POST /v1/chat/completions` body. Named apart in the OpenAPI document from ollama's
/// `ChatRequest`, which would otherwise take its place there.
#[derive(Deserialize, ToSchema, Debug)]
#[schema(as = ChatCompletionRequest)]
pub struct ChatRequest {
    pub model: Option<String>,
    pub messages: Vec<ChatMessageIn>,
    #[serde(flatten)]
    pub gen: Generation,
    pub max_completion_tokens: Option<i64>,
    #[serde(default)]
    pub logprobs: bool,
    pub top_logprobs: Option<usize>,
    /// `text`, `json_object`, or `json_schema` with `schema` (enforced whether `strict` or not).
    #[schema(value_type = Object)]
    pub response_format: Option<Value>,
    /// Functions the model may call: `[{type: "function", function: {name, description, parameters}}]`.
    #[schema(value_type = Vec<Object>)]
    pub tools: Option<Vec<Value>>,
    /// `auto` (default), `none`, `required`, or `{type: "function", function: {name}}`.
    #[schema(value_type = Object)]
    pub tool_choice: Option<Value>,
    /// Several calls in one answer (default true).
    pub parallel_tool_calls: Option<bool>,
    /// Extra variables for the chat template, e.g. `{"enable_thinking": false}`.
    #[schema(value_type = Object)]
    pub chat_template_kwargs: Option<Map<String, Value>>,
}

/// OpenAI's `tool_calls` entries (arguments as JSON text).
pub(crate) fn openai_calls(plan: &ChatPlan, calls: &[ParsedCall], with_index: bool) -> Vec<Value> {
    calls
        .iter()
        .enumerate()
        .map(|(k, c)| {
            let mut v = json!({"id": plan.call_id(), "type": "function",
                               "function": {"name": c.name, "arguments": c.arguments.to_string()}});
            if with_index {
                v["index"] = json!(k);
            }
            v
        })
        .collect()
}

/// The assistant message of a whole response.
fn message(plan: &ChatPlan, text: &str) -> (Value, bool) {
    let r = plan.reply(text);
    let called = !r.calls.is_empty();
    let mut m = json!({"role": "assistant", "content": if called && r.content.is_empty() { Value::Null } else { json!(r.content) }});
    if !r.reasoning.is_empty() {
        m["reasoning_content"] = json!(r.reasoning);
    }
    if called {
        m["tool_calls"] = json!(openai_calls(plan, &r.calls, false));
    }
    (m, called)
}

fn delta_chunk(i: usize, delta: Value, logprobs: Value) -> Value {
    json!({"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": null})
}

fn piece_delta(p: Piece) -> Value {
    match p {
        Piece::Content(t) => json!({"content": t}),
        Piece::Reasoning(t) => json!({"reasoning_content": t}),
    }
}

#[utoipa::path(post, path = "/v1/chat/completions", request_body = ChatRequest, tag = "openai",
    responses((status = 200, description = "chat.completion, or SSE chat.completion.chunk events"), (status = "4XX", body = crate::error::ErrorBody)))]
pub async fn chat_completions(State(state): State<AppState>, ApiJson(req): ApiJson<ChatRequest>) -> Result<Response, ApiError> {
    let n = check_n(req.gen.n)?;
    let mut knobs = req.gen.knobs(req.max_completion_tokens.or(req.gen.max_tokens), req.logprobs.then_some(req.top_logprobs.unwrap_or(0)));
    knobs.constraint = req.gen.guided.spec(req.response_format.as_ref())?;
    knobs.logit_bias = req.gen.logit_bias()?;
    knobs.tools = ToolRequest::read(req.tools, req.tool_choice.as_ref(), req.parallel_tool_calls)?;
    let options = ChatOptions { tools: None, kwargs: req.chat_template_kwargs.unwrap_or_default() };
    let prompt = Prompt::Chat { messages: to_chat(req.messages)?, options };
    let (model, streams, plan) = start_n(&state, req.model.as_deref(), prompt, &knobs, n).await?;
    let id = request_id("chatcmpl");
    let created = unix_now();
    let want_lp = req.logprobs;
    if !req.gen.stream {
        return whole_response(streams, &id, "chat.completion", created, &model, |i, c| {
            let logprobs = want_lp.then(|| json!({"content": c.logprobs.iter().map(chat_logprob).collect::<Vec<_>>()}));
            let (message, called) = message(&plan, &c.text);
            let finish = if called { Some("tool_calls") } else { c.finish.map(finish_str) };
            json!({"index": i, "message": message, "logprobs": logprobs, "finish_reason": finish})
        })
        .await;
    }
    let head = ChunkHead { id, object: "chat.completion.chunk", created, model, fingerprint: true };
    let opening = (0..n).map(|i| delta_chunk(i, json!({"role": "assistant", "content": ""}), Value::Null)).collect();
    let mut splitters: Vec<Option<Splitter>> = (0..n).map(|_| plan.active().then(|| plan.splitter())).collect();
    let on = move |i: usize, ev: ChoiceEvent| -> Vec<Value> {
        match ev {
            ChoiceEvent::Token(text, logprob) => {
                let lp = match (logprob, want_lp) {
                    (Some(l), true) => json!({"content": [chat_logprob(l)]}),
                    _ => Value::Null,
                };
                let pieces = match &mut splitters[i] {
                    Some(s) => s.push(&text),
                    None if text.is_empty() => vec![],
                    None => vec![Piece::Content(text)],
                };
                if pieces.is_empty() {
                    // the token's text is held back (a marker may be starting): its log-probability still goes out
                    return (!lp.is_null()).then(|| delta_chunk(i, json!({"content": ""}), lp)).into_iter().collect();
                }
                let mut lp = Some(lp);
                pieces.into_iter().map(|p| delta_chunk(i, piece_delta(p), lp.take().unwrap_or(Value::Null))).collect()
            }
            ChoiceEvent::Done(finish) => {
                let mut out = vec![];
                let mut finish = finish;
                if let Some(s) = splitters[i].take() {
                    let o = s.finish();
                    out.extend(o.tail.into_iter().map(|p| delta_chunk(i, piece_delta(p), Value::Null)));
                    if !o.calls.is_empty() {
                        out.push(delta_chunk(i, json!({"tool_calls": openai_calls(&plan, &o.calls, true)}), Value::Null));
                        finish = "tool_calls";
                    }
                }
                out.push(json!({"index": i, "delta": {}, "logprobs": null, "finish_reason": finish}));
                out
            }
        }
    };
    Ok(sse_choices(head, streams, opening, req.gen.include_usage(), on))
}
