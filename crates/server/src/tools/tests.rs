use super::format::{generic_instructions, generic_response};
use super::*;
use quarrel_engine::ConstraintSpec;
use quarrel_tokenizer::Tokenizer;
use serde_json::json;

fn weather() -> Value {
    json!({"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})
}

fn names() -> Vec<String> {
    vec!["get_weather".to_string(), "add".to_string()]
}

/// Feed `text` in pieces of `step` bytes (at char boundaries) and gather everything.
fn streamed(plan: &ChatPlan, text: &str, step: usize) -> Reply {
    let mut s = plan.splitter();
    let mut pieces = vec![];
    let mut i = 0;
    while i < text.len() {
        let mut j = (i + step).min(text.len());
        while !text.is_char_boundary(j) {
            j += 1;
        }
        pieces.extend(s.push(&text[i..j]));
        i = j;
    }
    Reply::gather(pieces, s.finish())
}

#[test]
fn formats_are_detected_from_templates() {
    let qwen = "{%- if tools %}<|im_start|>system\n# Tools\n<tools>{{ tool | tojson }}</tools>\nreturn a json object within <tool_call></tool_call> XML tags";
    let mistral = "{%- if tools is not none %}[AVAILABLE_TOOLS]{{ tools|tojson }}[/AVAILABLE_TOOLS]{%- endif %}[TOOL_CALLS]";
    let granite = "{%- if tools %}<|start_of_role|>available_tools<|end_of_role|>{{ tools | tojson }}{%- endif %}<|tool_call|>";
    let llama = "{%- if tools is not none %}<|start_header_id|>user<|end_header_id|>Given the following functions ... {\"name\": function name, \"parameters\": dictionary}";
    assert_eq!(ToolFormat::detect(Some(qwen)), ToolFormat::Hermes);
    assert_eq!(ToolFormat::detect(Some(mistral)), ToolFormat::Mistral);
    assert_eq!(ToolFormat::detect(Some(granite)), ToolFormat::Granite);
    assert_eq!(ToolFormat::detect(Some(llama)), ToolFormat::Llama3);
    // ChatML without tools (SmolLM2), no template at all
    assert_eq!(ToolFormat::detect(Some("{% for message in messages %}<|im_start|>{{ message['role'] }}")), ToolFormat::Generic);
    assert_eq!(ToolFormat::detect(None), ToolFormat::Generic);
    // GPT-OSS: harmony with or without tools in the template
    assert_eq!(ToolFormat::detect(Some("<|start|>assistant<|channel|>final<|message|>")), ToolFormat::Harmony);
}

#[test]
fn calls_parse_in_every_format() {
    let n = ["get_weather", "add"];
    let h = "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n</tool_call>";
    let (rest, calls) = ToolFormat::Hermes.parse(h, &n).unwrap();
    assert_eq!(rest, "Let me look.");
    assert_eq!(calls.len(), 2);
    assert_eq!((calls[0].name.as_str(), &calls[0].arguments), ("get_weather", &json!({"city": "Paris"})));
    let m = "[TOOL_CALLS][{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}]";
    assert_eq!(ToolFormat::Mistral.parse(m, &n).unwrap().1[0].arguments, json!({"a": 1, "b": 2}));
    // the marker is a control token the detokenizer may leave out
    assert_eq!(ToolFormat::Mistral.parse(&m["[TOOL_CALLS]".len()..], &n).unwrap().1[0].name, "add");
    let g = "<|tool_call|>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]";
    assert_eq!(ToolFormat::Granite.parse(g, &n).unwrap().1[0].arguments["city"], "Oslo");
    let l = "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}";
    assert_eq!(ToolFormat::Llama3.parse(l, &n).unwrap().1[0].arguments["city"], "Rome");
    let j = "{\"tool_calls\": [{\"name\": \"add\", \"arguments\": {\"a\": 3}}]}";
    assert_eq!(ToolFormat::Generic.parse(j, &n).unwrap().1[0].arguments["a"], 3);
    // arguments sent as JSON text are parsed
    let s = "<tool_call>{\"name\": \"add\", \"arguments\": \"{\\\"a\\\": 5}\"}</tool_call>";
    assert_eq!(ToolFormat::Hermes.parse(s, &n).unwrap().1[0].arguments["a"], 5);
    // unknown tools, broken JSON and plain answers are not calls
    assert!(ToolFormat::Hermes.parse("<tool_call>{\"name\": \"rm_rf\", \"arguments\": {}}</tool_call>", &n).is_none());
    assert!(ToolFormat::Hermes.parse("<tool_call>{\"name\": \"add\", ", &n).is_none());
    let cut_list = "{\"tool_calls\": [{\"name\": \"add\", \"arguments\": {\"a\": 1}}, {\"name\": \"add\", \"argu";
    assert_eq!(ToolFormat::Generic.parse(cut_list, &n).unwrap().1.len(), 1);
    assert_eq!(ToolFormat::Mistral.parse("[TOOL_CALLS][{\"name\": \"add\", \"arguments\": {}}, {", &n).unwrap().1.len(), 1);
    assert!(ToolFormat::Generic.parse("{\"tool_calls\": [{\"name\": \"ad", &n).is_none());
    // cut off by the length limit after complete calls: those stand
    let cut = format!("{h}\n<tool_call>\n{{\"name\": \"ad");
    assert_eq!(ToolFormat::Hermes.parse(&cut, &n).unwrap(), ToolFormat::Hermes.parse(h, &n).unwrap());
    assert!(ToolFormat::Llama3.parse("The weather is fine.", &n).is_none());
    assert!(ToolFormat::Generic.parse("{\"response\": \"hi\"}", &n).is_none());
    assert_eq!(generic_response("{\"response\": \"hi \\\"there\\\"\"}").as_deref(), Some("hi \"there\""));
}

#[test]
fn streaming_splits_as_the_whole_text_does() {
    let hermes = ChatPlan { tools: Some((ToolFormat::Hermes, names())), think: true, harmony: false };
    let texts = [
        "<think>The user wants weather.\nUse the tool.</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\"}}\n</tool_call>",
        "<think>short</think>The answer is 4. A < B and <tool is not a call.",
        "No reasoning, text with < and </ and </think inside.",
        "Partial <tool_ca",
    ];
    for t in texts {
        let whole = hermes.reply(t);
        for step in [1, 2, 3, 7, 64] {
            assert_eq!(streamed(&hermes, t, step), whole, "{t:?} in pieces of {step}");
        }
    }
    let r = hermes.reply(texts[0]);
    assert_eq!(r.reasoning, "The user wants weather.\nUse the tool.");
    assert_eq!((r.content.as_str(), r.calls.len()), ("", 1));
    assert_eq!(r.calls[0].arguments["city"], "Zürich");
    let r = hermes.reply(texts[1]);
    assert_eq!((r.reasoning.as_str(), r.content.as_str()), ("short", "The answer is 4. A < B and <tool is not a call."));
    assert_eq!(hermes.reply(texts[3]).content, "Partial <tool_ca");

    let generic = ChatPlan { tools: Some((ToolFormat::Generic, names())), think: false, harmony: false };
    let answer = "{\"response\": \"Line one\\nline \\\"two\\\" \\u00e9\\ud83d\\ude00 end\"}";
    let call = "{\"tool_calls\": [{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}]}";
    for t in [answer, call] {
        let whole = generic.reply(t);
        for step in [1, 2, 5, 13] {
            assert_eq!(streamed(&generic, t, step), whole, "{t:?} in pieces of {step}");
        }
    }
    assert_eq!(generic.reply(answer).content, "Line one\nline \"two\" é😀 end");
    assert_eq!(generic.reply(call).calls[0].arguments, json!({"a": 1, "b": 2}));

    let llama = ChatPlan { tools: Some((ToolFormat::Llama3, names())), think: false, harmony: false };
    let t = "{\"name\": \"add\", \"parameters\": {\"a\": 1}}";
    assert_eq!(streamed(&llama, t, 1).calls[0].name, "add");
    assert_eq!(streamed(&llama, "Plain answer.", 1).content, "Plain answer.");

    // nothing to split: the text passes untouched, leading spaces included
    let plain = ChatPlan::default();
    assert_eq!(streamed(&plain, "  <think>x</think>", 1).content, "  <think>x</think>");
}

#[test]
fn requests_are_checked() {
    let ok = ToolRequest::read(Some(vec![weather()]), Some(&json!("required")), Some(false)).unwrap().unwrap();
    assert_eq!((ok.choice, ok.parallel), (ToolChoice::Required, false));
    let named = ToolRequest::read(Some(vec![weather()]), Some(&json!({"type": "function", "function": {"name": "get_weather"}})), None);
    assert_eq!(named.unwrap().unwrap().choice, ToolChoice::Named("get_weather".into()));
    assert!(ToolRequest::read(None, None, None).unwrap().is_none());
    for (tools, choice) in [
        (Some(vec![weather()]), json!("sometimes")),
        (Some(vec![weather()]), json!({"type": "function", "function": {"name": "other"}})),
        (None, json!("required")),
        (Some(vec![json!({"type": "function", "function": {}})]), json!("auto")),
        (Some(vec![weather(), weather()]), json!("auto")),
        (Some(vec![json!({"type": "function", "function": {"name": "f", "parameters": "x"}})]), json!("auto")),
        (Some(vec![json!({"type": "retrieval"})]), json!("auto")),
    ] {
        let e = ToolRequest::read(tools.clone(), Some(&choice), None).unwrap_err();
        assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST, "{tools:?} {choice}");
    }
}

#[test]
fn generic_history_and_instructions() {
    let mut msgs = vec![
        ChatMessage::user("weather in Paris?"),
        ChatMessage {
            role: "assistant".into(),
            tool_calls: vec![quarrel_tokenizer::ToolCall {
                id: "c1".into(),
                name: "get_weather".into(),
                arguments: json!({"city": "Paris"}),
            }],
            ..Default::default()
        },
        ChatMessage { role: "tool".into(), content: "21 C".into(), tool_call_id: Some("c1".into()), ..Default::default() },
    ];
    write_history_as_json(&mut msgs);
    assert_eq!(msgs[1].content, r#"{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}"#);
    assert_eq!(msgs[2].role, "user");
    assert_eq!(serde_json::from_str::<Value>(&msgs[2].content).unwrap(), json!({"tool_response": {"content": "21 C", "id": "c1"}}));
    let text = generic_instructions(&[weather()], true);
    assert!(text.contains("get_weather") && text.contains("\"response\""));
    assert!(!generic_instructions(&[weather()], false).contains("\"response\""));
}

#[test]
fn call_ids_fit_the_format() {
    let mistral = ChatPlan { tools: Some((ToolFormat::Mistral, names())), think: false, harmony: false };
    let id = mistral.call_id();
    assert!(id.len() == 9 && id.chars().all(|c| c.is_ascii_alphanumeric()), "{id}");
    assert!(ChatPlan::default().call_id().starts_with("call_"));
}

/// The synthetic model's tokenizer (byte tokens, pieces, control tokens).
fn tokenizer() -> &'static Tokenizer {
    static TOK: std::sync::OnceLock<Tokenizer> = std::sync::OnceLock::new();
    TOK.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        quarrel_synth::write_tiny(&path, quarrel_synth::Ftype::F32, 1).unwrap();
        Tokenizer::from_gguf(&quarrel_gguf::Gguf::open(&path).unwrap()).unwrap()
    })
}

/// Decode under `grammar` with random logits, picking the best allowed token each step.
fn walk(compiler: &quarrel_engine::ConstraintCompiler, grammar: &str, seed: u64) -> String {
    use rand::{Rng, SeedableRng};
    let tok = tokenizer();
    let mut c = compiler.compile(&ConstraintSpec::Lark(grammar.to_string())).unwrap_or_else(|e| panic!("{e}\n{grammar}"));
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut bytes = vec![];
    for _ in 0..400 {
        let mask = c.mask();
        let mut logits: Vec<f32> = (0..tok.n_vocab()).map(|_| rng.gen_range(-4.0..4.0)).collect();
        mask.apply(&mut logits);
        let id = (0..logits.len()).max_by(|&a, &b| logits[a].total_cmp(&logits[b])).unwrap() as u32;
        if tok.is_eog(id) {
            break;
        }
        bytes.extend(tok.token_to_piece(id, false));
        c.accept(id).unwrap();
        if c.is_finished() {
            break;
        }
    }
    String::from_utf8(bytes).unwrap()
}

#[test]
fn forced_calls_parse_and_follow_the_schemas_in_every_format() {
    let tools = vec![
        json!({"type": "function", "function": {"name": "pick", "parameters": {"type": "object",
            "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9}, "c": {"enum": ["red", "blue"]}},
            "required": ["n", "c"], "additionalProperties": false}}}),
        json!({"type": "function", "function": {"name": "stop", "parameters": {"type": "object", "properties": {}, "additionalProperties": false}}}),
    ];
    let names = ["pick", "stop"];
    let compiler = quarrel_engine::ConstraintCompiler::new(tokenizer()).unwrap();
    for format in [ToolFormat::Hermes, ToolFormat::Mistral, ToolFormat::Granite, ToolFormat::Llama3, ToolFormat::Generic] {
        for parallel in [false, true] {
            let grammar = format.grammar(tokenizer(), &tools, parallel, false);
            for seed in 0..6 {
                let text = walk(&compiler, &grammar, seed);
                let (rest, calls) = format.parse(&text, &names).unwrap_or_else(|| panic!("{format:?}: no calls in {text:?}"));
                assert!(rest.is_empty(), "{format:?}: {text:?}");
                assert!(parallel || calls.len() == 1, "{format:?}: {calls:?}");
                for c in calls {
                    if c.name == "pick" {
                        let n = c.arguments["n"].as_i64().unwrap();
                        assert!((1..=9).contains(&n) && ["red", "blue"].contains(&c.arguments["c"].as_str().unwrap()), "{text}");
                    } else {
                        assert_eq!(c.arguments, json!({}), "{text}");
                    }
                }
            }
        }
    }
    // harmony: one call whatever `parallel` says, read back by the harmony splitter
    let plan = ChatPlan { tools: Some((ToolFormat::Harmony, names.iter().map(|n| n.to_string()).collect())), think: false, harmony: true };
    for parallel in [false, true] {
        let grammar = ToolFormat::Harmony.grammar(tokenizer(), &tools, parallel, false);
        for seed in 0..6 {
            let text = walk(&compiler, &grammar, seed);
            let reply = plan.reply(&text);
            assert_eq!((reply.content.as_str(), reply.calls.len()), ("", 1), "{text:?}");
            assert!(names.contains(&reply.calls[0].name.as_str()), "{text:?}");
        }
    }
    // the generic format with tool_choice auto admits a direct answer too
    let grammar = ToolFormat::Generic.grammar(tokenizer(), &tools, true, true);
    for seed in 0..8 {
        let text = walk(&compiler, &grammar, seed);
        assert!(ToolFormat::Generic.parse(&text, &names).is_some() || generic_response(&text).is_some(), "{text:?}");
    }
}
