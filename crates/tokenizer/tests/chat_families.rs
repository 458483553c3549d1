//! Chat templates of the Qwen2.5, Qwen3, QwQ, Llama 3.x, Phi-3.5 and DeepSeek-R1 families (as
//! llama.cpp ships them, `scripts/fetch-testdata.sh`) render as Hugging Face transformers
//! renders them: tests/fixtures/chat/renders.json (tests/fixtures/chat/gen_chat.py) holds
//! transformers' rendering of five conversations per template, and of conversations with
//! tools, tool calls and tool results (and `enable_thinking`) for the templates that render
//! tools.

mod common;

use common::{read_json, testdata};
use quarrel_tokenizer::{ChatMessage, ChatOptions, ChatTemplate, TokenizerError, ToolCall};
use serde_json::Value;

/// A fixture message (OpenAI's shape) as a [`ChatMessage`].
fn message(m: &Value) -> ChatMessage {
    let calls = m["tool_calls"].as_array().map(|a| a.as_slice()).unwrap_or_default();
    ChatMessage {
        role: m["role"].as_str().unwrap().to_string(),
        content: m["content"].as_str().unwrap().to_string(),
        tool_calls: calls
            .iter()
            .map(|c| ToolCall {
                id: c["id"].as_str().unwrap().to_string(),
                name: c["function"]["name"].as_str().unwrap().to_string(),
                arguments: c["function"]["arguments"].clone(),
            })
            .collect(),
        tool_call_id: m["tool_call_id"].as_str().map(str::to_string),
        name: m["name"].as_str().map(str::to_string),
        reasoning_content: None,
    }
}

#[test]
fn templates_render_as_transformers() {
    let doc = read_json("chat/renders.json");
    let cases = doc["cases"].as_array().expect("cases");
    // a template that asks for today's date got it written as {{DATE}} in the fixture
    let today = today_forms();
    let mut bad = vec![];
    for c in cases {
        let name = c["template"].as_str().unwrap();
        let Some(path) = testdata(&format!("templates/{name}")) else { return };
        let source = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let t = ChatTemplate::new(&source, c["bos_token"].as_str().unwrap(), c["eos_token"].as_str().unwrap())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let messages: Vec<ChatMessage> = c["messages"].as_array().unwrap().iter().map(message).collect();
        let options =
            ChatOptions { tools: c.get("tools").cloned(), kwargs: c.get("kwargs").and_then(Value::as_object).cloned().unwrap_or_default() };
        let got = t.render_with(&messages, c["add_generation_prompt"].as_bool().unwrap(), &options);
        let ok = match (&got, c["text"].as_str()) {
            (Ok(text), Some(want)) => today.iter().fold(text.clone(), |t, d| t.replace(d, "{{DATE}}")) == want,
            (Err(TokenizerError::TemplateException(_)), None) => true,
            _ => false,
        };
        if !ok {
            bad.push(format!("{name} {:?}:\n  want {:?}\n  got  {got:?}", messages.iter().map(|m| &m.role).collect::<Vec<_>>(), c["text"]));
        }
    }
    eprintln!("{}/{} renders identical to transformers'", cases.len() - bad.len(), cases.len());
    assert!(bad.is_empty(), "{} renders differ:\n{}", bad.len(), bad.join("\n"));
}

/// Today (UTC) in the forms the templates ask `strftime_now` for (as gen_chat.py's
/// `DATE_FORMATS`).
fn today_forms() -> Vec<String> {
    ["%d %b %Y", "%Y-%m-%d", "%B %d, %Y"]
        .iter()
        .map(|f| ChatTemplate::new(&format!("{{{{ strftime_now('{f}') }}}}"), "", "").unwrap().render(&[], false).unwrap())
        .collect()
}
