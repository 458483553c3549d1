//! OpenAI-compatible API: `POST /v1/chat/completions` (in `chat`), `POST /v1/completions`
//! (SSE `data:` chunks ending in `[DONE]` when `stream` is set), `POST /v1/embeddings` (float
//! or base64, the model's pooling, L2-normalized) and `GET /v1/models`.

mod chat;

pub use chat::*;

use crate::embeddings::PromptListIn;
use crate::error::{ApiError, ApiJson};
use crate::gen::{finish_str, start, unix_now, Collected, Knobs, Tracked};
use crate::metrics::ModelLabel;
use crate::state::AppState;
use crate::structured::GuidedFields;
use crate::tools::ChatPlan;
use axum::extract::{Path, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use quarrel_engine::{Prompt, StreamEvent, TokenLogprob};
use serde::Deserialize;
use serde_json::{json, Value};
use std::convert::Infallible;
use utoipa::ToSchema;

/// A string or a list of strings (`stop`).
#[derive(Deserialize, ToSchema, Debug, Clone)]
#[serde(untagged)]
pub enum StringOrList {
    One(String),
    Many(Vec<String>),
}

impl StringOrList {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            StringOrList::One(s) => vec![s],
            StringOrList::Many(v) => v,
        }
    }
}

#[derive(Deserialize, ToSchema, Debug, Default, Clone)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// The fields `/v1/chat/completions` and `/v1/completions` share: streaming, the number of
/// choices, and the sampling knobs (flattened into both request bodies).
#[derive(Deserialize, ToSchema, Debug)]
pub struct Generation {
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub max_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// Extension: top-k (0 = off).
    pub top_k: Option<i64>,
    /// Extension: min-p.
    pub min_p: Option<f64>,
    pub seed: Option<i64>,
    pub stop: Option<StringOrList>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    /// Number of choices (1..=16).
    pub n: Option<u32>,
    /// Extension (llama-server, vLLM): keep generating after the end-of-generation token.
    #[serde(default)]
    pub ignore_eos: bool,
    /// Token id (as a string key) -> bias added to its logit, -100..=100.
    #[schema(value_type = Object)]
    pub logit_bias: Option<serde_json::Map<String, Value>>,
    /// Extension: `false` turns the server's speculative decoding off for this request (the
    /// output is the same either way).
    pub speculative: Option<bool>,
    /// Structured output in llama-server's and vLLM's spellings.
    #[serde(flatten)]
    pub guided: GuidedFields,
}

impl Generation {
    /// The engine's knobs (OpenAI's default temperature 1.0), with the endpoint's own
    /// `max_tokens` and `logprobs` reading.
    pub(crate) fn knobs(&self, max_tokens: Option<i64>, logprobs: Option<usize>) -> Knobs {
        Knobs {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            max_tokens,
            seed: self.seed,
            stop: self.stop.clone().map(StringOrList::into_vec).unwrap_or_default(),
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            logprobs,
            default_temperature: 1.0,
            ignore_eos: self.ignore_eos,
            speculative: self.speculative,
            ..Default::default()
        }
    }

    /// `logit_bias` as token ids and biases (its range is checked with the other knobs).
    pub(crate) fn logit_bias(&self) -> Result<Vec<(u32, f32)>, ApiError> {
        self.logit_bias
            .iter()
            .flatten()
            .map(|(k, v)| match (k.parse::<u32>(), v.as_f64()) {
                (Ok(t), Some(b)) => Ok((t, b as f32)),
                _ => Err(ApiError::invalid(format!("logit_bias: {k:?}: {v} is not a token id and a number"))),
            })
            .collect()
    }

    pub(crate) fn include_usage(&self) -> bool {
        self.stream_options.as_ref().is_some_and(|o| o.include_usage)
    }
}

/// `POST /v1/completions` body.
#[derive(Deserialize, ToSchema, Debug)]
pub struct CompletionRequest {
    pub model: Option<String>,
    /// Text or token ids; a list holds exactly one.
    pub prompt: PromptListIn,
    #[serde(flatten)]
    pub gen: Generation,
    /// Number of most likely alternatives to report per token (0..=20).
    pub logprobs: Option<usize>,
    #[serde(default)]
    pub echo: bool,
    /// As in chat completions (llama-server takes it here too).
    #[schema(value_type = Object)]
    pub response_format: Option<Value>,
}

/// Most choices per request.
pub(crate) const MAX_N: u32 = 16;

pub(crate) fn check_n(n: Option<u32>) -> Result<usize, ApiError> {
    match n.unwrap_or(1) {
        n @ 1..=MAX_N => Ok(n as usize),
        n => Err(ApiError::invalid(format!("n must be between 1 and {MAX_N}, got {n}"))),
    }
}

/// Start `n` generations of one prompt (choice `i` uses seed `seed + i` when a seed is
/// given); they run side by side in the engine's batch. If one cannot start, the others
/// are dropped, which cancels them.
pub(crate) async fn start_n(
    state: &AppState,
    model: Option<&str>,
    prompt: Prompt,
    knobs: &Knobs,
    n: usize,
) -> Result<(String, Vec<Tracked>, ChatPlan), ApiError> {
    let mut streams = Vec::with_capacity(n);
    let mut name = String::new();
    let mut plan = ChatPlan::default();
    for i in 0..n {
        let mut k = knobs.clone();
        k.seed = knobs.seed.map(|s| s.wrapping_add(i as i64));
        let started = start(state, model, prompt.clone(), &k).await?;
        name = started.model.entry.name.clone();
        plan = started.plan;
        streams.push(started.stream);
    }
    Ok((name, streams, plan))
}

/// A whole (non-streamed) response: every choice run to its end and rendered by `choice`,
/// with the usage over all of them.
pub(crate) async fn whole_response(
    streams: Vec<Tracked>,
    id: &str,
    object: &str,
    created: u64,
    model: &str,
    choice: impl Fn(usize, &Collected) -> Value,
) -> Result<Response, ApiError> {
    let all = futures_util::future::try_join_all(streams.into_iter().map(Tracked::collect)).await?;
    let choices: Vec<Value> = all.iter().enumerate().map(|(i, c)| choice(i, c)).collect();
    let body = json!({
        "id": id, "object": object, "created": created, "model": model, "choices": choices,
        "usage": usage_json(&total_usage(all.iter().map(|c| c.usage))),
        "system_fingerprint": "quarrel",
    });
    Ok(labeled(Json(body).into_response(), model))
}

/// Usage over all choices: the prompt counted once, completions summed.
fn total_usage(us: impl Iterator<Item = quarrel_engine::Usage>) -> quarrel_engine::Usage {
    let mut t = quarrel_engine::Usage::default();
    for u in us {
        t.prompt_tokens = u.prompt_tokens;
        t.cached_tokens = t.cached_tokens.max(u.cached_tokens);
        t.completion_tokens += u.completion_tokens;
    }
    t
}

/// Every choice's events, tagged with the choice index, as they come.
fn merged(streams: Vec<Tracked>) -> impl futures_util::Stream<Item = (usize, StreamEvent)> + Send {
    futures_util::stream::select_all(streams.into_iter().enumerate().map(|(i, mut t)| {
        Box::pin(async_stream::stream! {
            while let Some(ev) = t.next().await {
                yield (i, ev);
            }
        })
    }))
}

pub(crate) fn labeled(mut r: Response, model: &str) -> Response {
    r.extensions_mut().insert(ModelLabel(model.to_string()));
    r
}

pub(crate) fn sse_json(v: &Value) -> Result<Event, Infallible> {
    Ok(Event::default().data(v.to_string()))
}

pub(crate) fn usage_json(c: &quarrel_engine::Usage) -> Value {
    json!({
        "prompt_tokens": c.prompt_tokens,
        "completion_tokens": c.completion_tokens,
        "total_tokens": c.prompt_tokens + c.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": c.cached_tokens},
    })
}

pub(crate) fn chat_logprob(lp: &TokenLogprob) -> Value {
    json!({
        "token": lp.text,
        "logprob": lp.logprob,
        "bytes": lp.text.as_bytes(),
        "top_logprobs": lp.top.iter().map(|(_, t, l)| json!({"token": t, "logprob": l, "bytes": t.as_bytes()})).collect::<Vec<_>>(),
    })
}

fn completion_logprobs(lps: &[TokenLogprob], offset0: usize) -> Value {
    let mut offs = vec![];
    let mut o = offset0;
    for lp in lps {
        offs.push(o);
        o += lp.text.len();
    }
    json!({
        "tokens": lps.iter().map(|l| &l.text).collect::<Vec<_>>(),
        "token_logprobs": lps.iter().map(|l| l.logprob).collect::<Vec<_>>(),
        "top_logprobs": lps.iter().map(|l| l.top.iter().map(|(_, t, p)| (t.clone(), json!(p))).collect::<serde_json::Map<_, _>>()).collect::<Vec<_>>(),
        "text_offset": offs,
    })
}

/// The envelope of an endpoint's streamed chunks.
pub(crate) struct ChunkHead {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    /// Chat chunks carry `system_fingerprint`.
    pub fingerprint: bool,
}

impl ChunkHead {
    /// A chunk with one choice.
    fn chunk(&self, choice: Value) -> Value {
        let mut v = json!({"id": self.id, "object": self.object, "created": self.created, "model": self.model});
        if self.fingerprint {
            v["system_fingerprint"] = json!("quarrel");
        }
        v["choices"] = json!([choice]);
        v
    }

    /// The last chunk when `stream_options.include_usage` is set: no choices, the usage.
    fn usage(&self, usages: Vec<quarrel_engine::Usage>) -> Value {
        json!({"id": self.id, "object": self.object, "created": self.created, "model": self.model, "choices": [],
               "usage": usage_json(&total_usage(usages.into_iter()))})
    }
}

/// What happened to one choice of a stream.
pub(crate) enum ChoiceEvent<'a> {
    Token(String, Option<&'a TokenLogprob>),
    Done(&'static str),
}

/// The SSE response of streamed choices: the `opening` choice objects, then the choice
/// objects `on` makes of each event of choice `i` (none, one or several), error bodies as
/// they come, the usage chunk when asked for, and `[DONE]`.
pub(crate) fn sse_choices(
    head: ChunkHead,
    streams: Vec<Tracked>,
    opening: Vec<Value>,
    include_usage: bool,
    mut on: impl FnMut(usize, ChoiceEvent) -> Vec<Value> + Send + 'static,
) -> Response {
    let model = head.model.clone();
    let mut events_in = merged(streams);
    let events = async_stream::stream! {
        for choice in opening {
            yield sse_json(&head.chunk(choice));
        }
        let mut usages = vec![];
        while let Some((i, ev)) = events_in.next().await {
            let choices = match ev {
                StreamEvent::Token { text, logprob, .. } => on(i, ChoiceEvent::Token(text, logprob.as_ref())),
                StreamEvent::Done { finish_reason, usage, .. } => {
                    usages.push(usage);
                    on(i, ChoiceEvent::Done(finish_str(finish_reason)))
                }
                StreamEvent::Error(e) => {
                    yield sse_json(&serde_json::to_value(ApiError::from(e).body()).unwrap_or_default());
                    vec![]
                }
            };
            for choice in choices {
                yield sse_json(&head.chunk(choice));
            }
        }
        if include_usage {
            yield sse_json(&head.usage(usages));
        }
        yield Ok(Event::default().data("[DONE]"));
    };
    labeled(Sse::new(events).keep_alive(KeepAlive::default()).into_response(), &model)
}

pub(crate) fn request_id(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

#[utoipa::path(post, path = "/v1/completions", request_body = CompletionRequest, tag = "openai",
    responses((status = 200, description = "text_completion, or SSE events"), (status = "4XX", body = crate::error::ErrorBody)))]
pub async fn completions(State(state): State<AppState>, ApiJson(req): ApiJson<CompletionRequest>) -> Result<Response, ApiError> {
    let n = check_n(req.gen.n)?;
    let mut knobs = req.gen.knobs(Some(req.gen.max_tokens.unwrap_or(16)), req.logprobs);
    knobs.logit_bias = req.gen.logit_bias()?;
    knobs.constraint = req.gen.guided.spec(req.response_format.as_ref())?;
    let prompt = req.prompt.into_prompt()?;
    let echo_text = match (&prompt, req.echo) {
        (Prompt::Text(t), true) => t.clone(),
        (_, true) => return Err(ApiError::invalid("echo is supported for text prompts only")),
        _ => String::new(),
    };
    let (model, streams, _) = start_n(&state, req.model.as_deref(), prompt, &knobs, n).await?;
    let id = request_id("cmpl");
    let created = unix_now();
    if !req.gen.stream {
        return whole_response(streams, &id, "text_completion", created, &model, |i, c| {
            let lp = req.logprobs.map(|_| completion_logprobs(&c.logprobs, echo_text.len()));
            json!({"index": i, "text": format!("{echo_text}{}", c.text), "logprobs": lp, "finish_reason": c.finish.map(finish_str)})
        })
        .await;
    }
    let want_lp = req.logprobs.is_some();
    let head = ChunkHead { id, object: "text_completion", created, model, fingerprint: false };
    let opening = match echo_text.is_empty() {
        true => vec![],
        false => (0..n).map(|i| json!({"index": i, "text": echo_text, "logprobs": null, "finish_reason": null})).collect(),
    };
    let on = move |i: usize, ev: ChoiceEvent| match ev {
        ChoiceEvent::Token(text, logprob) => {
            let lp = match (logprob, want_lp) {
                (Some(l), true) => completion_logprobs(std::slice::from_ref(l), 0),
                _ => Value::Null,
            };
            let send = !text.is_empty() || !lp.is_null();
            send.then(|| json!({"index": i, "text": text, "logprobs": lp, "finish_reason": null})).into_iter().collect()
        }
        ChoiceEvent::Done(finish) => vec![json!({"index": i, "text": "", "logprobs": null, "finish_reason": finish})],
    };
    Ok(sse_choices(head, streams, opening, req.gen.include_usage(), on))
}

fn model_obj(name: &str, created: u64) -> Value {
    json!({"id": name, "object": "model", "created": created, "owned_by": "quarrel"})
}

#[utoipa::path(get, path = "/v1/models", tag = "openai", responses((status = 200, description = "models that can be used")))]
pub async fn list_models(State(state): State<AppState>) -> Json<Value> {
    let mut names: Vec<String> = state.registry.loaded().iter().map(|m| m.entry.name.clone()).collect();
    for e in state.registry.catalog() {
        if !names.contains(&e.name) {
            names.push(e.name);
        }
    }
    let created = unix_now();
    Json(json!({"object": "list", "data": names.iter().map(|n| model_obj(n, created)).collect::<Vec<_>>()}))
}

#[utoipa::path(get, path = "/v1/models/{model}", tag = "openai", params(("model" = String, Path)),
    responses((status = 200, description = "one model"), (status = 404, body = crate::error::ErrorBody)))]
pub async fn get_model(State(state): State<AppState>, Path(model): Path<String>) -> Result<Json<Value>, ApiError> {
    let e = state.registry.find_entry(&model).ok_or_else(|| ApiError::model_not_found(&model))?;
    Ok(Json(model_obj(&e.name, unix_now())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use utoipa::OpenApi;

    /// Every property name of `schema`, following `$ref`s and `allOf` (how the flattened
    /// [`Generation`] fields appear).
    fn properties(doc: &Value, schema: &Value, out: &mut BTreeSet<String>) {
        if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
            let name = r.strip_prefix("#/components/schemas/").expect("local schema ref");
            let target = &doc["components"]["schemas"][name];
            assert!(!target.is_null(), "dangling $ref {r}");
            return properties(doc, target, out);
        }
        if let Some(Value::Object(p)) = schema.get("properties") {
            out.extend(p.keys().cloned());
        }
        for part in schema.get("allOf").and_then(Value::as_array).into_iter().flatten() {
            properties(doc, part, out);
        }
    }

    fn body_fields(doc: &Value, path: &str) -> BTreeSet<String> {
        let schema = &doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"];
        assert!(!schema.is_null(), "{path}: no request body schema");
        let mut out = BTreeSet::new();
        properties(doc, schema, &mut out);
        out
    }

    #[test]
    fn openapi_request_bodies_list_the_shared_and_own_fields() {
        let doc = serde_json::to_value(crate::openapi::ApiDoc::openapi()).unwrap();
        let shared = [
            "stream",
            "stream_options",
            "max_tokens",
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "seed",
            "stop",
            "presence_penalty",
            "frequency_penalty",
            "n",
        ];
        let chat = body_fields(&doc, "/v1/chat/completions");
        let completion = body_fields(&doc, "/v1/completions");
        for f in
            shared.iter().chain(&["model", "messages", "max_completion_tokens", "logprobs", "top_logprobs", "response_format", "tools"])
        {
            assert!(chat.contains(*f), "chat request schema lacks {f}: {chat:?}");
        }
        for f in shared.iter().chain(&["model", "prompt", "logprobs", "echo"]) {
            assert!(completion.contains(*f), "completion request schema lacks {f}: {completion:?}");
        }
        assert!(!completion.contains("messages") && !chat.contains("prompt") && !chat.contains("keep_alive"));
        // ollama's chat body keeps its own schema
        let ollama_chat = body_fields(&doc, "/api/chat");
        assert!(ollama_chat.contains("options") && ollama_chat.contains("keep_alive"), "{ollama_chat:?}");
    }

    #[test]
    fn shared_fields_reach_the_knobs_of_both_endpoints() {
        let chat: ChatRequest = serde_json::from_value(json!({
            "messages": [{"role": "user", "content": "hi"}], "temperature": 0.5, "top_k": 7, "stop": "x",
            "max_tokens": 9, "max_completion_tokens": 11, "logprobs": true, "top_logprobs": 2, "n": 3, "stream": true,
            "stream_options": {"include_usage": true}, "seed": 4, "presence_penalty": 0.25,
        }))
        .unwrap();
        let k = chat.gen.knobs(chat.max_completion_tokens.or(chat.gen.max_tokens), chat.logprobs.then_some(2));
        assert_eq!((k.temperature, k.top_k, k.max_tokens, k.seed, k.logprobs), (Some(0.5), Some(7), Some(11), Some(4), Some(2)));
        assert_eq!((k.stop, k.presence_penalty, k.default_temperature), (vec!["x".to_string()], Some(0.25), 1.0));
        assert!(chat.gen.stream && chat.gen.include_usage() && chat.gen.n == Some(3));

        let c: CompletionRequest =
            serde_json::from_value(json!({"prompt": "a", "top_p": 0.9, "stop": ["y", "z"], "logprobs": 3, "echo": true})).unwrap();
        let k = c.gen.knobs(c.gen.max_tokens, c.logprobs);
        assert_eq!((k.top_p, k.logprobs, k.max_tokens, k.stop.len()), (Some(0.9), Some(3), None, 2));
        assert!(c.echo && !c.gen.stream && !c.gen.include_usage());

        // wrong types inside the flattened fields are still errors
        assert!(serde_json::from_value::<ChatRequest>(json!({"messages": [], "temperature": "hot"})).is_err());
        assert!(serde_json::from_value::<CompletionRequest>(json!({"prompt": "a", "max_tokens": "ten"})).is_err());
    }
}
