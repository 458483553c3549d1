//! Chat templates: SmolLM2's real template, errors, fallback.

mod common;

use common::{load, GEMMA3, SMOLLM2};
use quarrel_gguf::{Gguf, Value};
use quarrel_tokenizer::{ChatMessage, Tokenizer, TokenizerError};

#[test]
fn smollm2_template_system_user() {
    let Some(tok) = load(SMOLLM2) else { return };
    let msgs = [ChatMessage::system("You are a concise assistant."), ChatMessage::user("What is 2+2?")];
    let out = tok.apply_chat_template(&msgs, true).unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nYou are a concise assistant.<|im_end|>\n\
         <|im_start|>user\nWhat is 2+2?<|im_end|>\n\
         <|im_start|>assistant\n"
    );
    // the rendered prompt tokenizes with the ChatML control tokens
    let ids = tok.encode(&out, true, true);
    assert_eq!(ids.iter().filter(|&&i| i == 1).count(), 3);
    assert_eq!(ids.iter().filter(|&&i| i == 2).count(), 2);
    // without the generation prompt
    let out = tok.apply_chat_template(&msgs, false).unwrap();
    assert!(out.ends_with("What is 2+2?<|im_end|>\n"));
}

#[test]
fn smollm2_template_default_system_prompt() {
    let Some(tok) = load(SMOLLM2) else { return };
    let out = tok.apply_chat_template(&[ChatMessage::user("Hi")], true).unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
}

fn with_template(base: &Gguf, template: &str) -> Tokenizer {
    Tokenizer::from_gguf(&common::with_key(base, "tokenizer.chat_template", Value::String(template.to_string()))).unwrap()
}

#[test]
fn raise_exception_surfaces_as_err() {
    let Some(base) = common::open(common::SMOLLM2) else { return };
    let tok = with_template(
        &base,
        "{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}\
         {{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}\
         {{ bos_token + m.content + eos_token }}{% endfor %}",
    );
    match tok.apply_chat_template(&[ChatMessage::system("x")], true) {
        Err(TokenizerError::TemplateException(msg)) => {
            assert_eq!(msg, "Only user and assistant roles are supported!")
        }
        other => panic!("expected TemplateException, got {other:?}"),
    }
    assert_eq!(tok.apply_chat_template(&[ChatMessage::user("x")], true).unwrap(), "<|im_start|>x<|im_end|>");
    let broken = with_template(&base, "{% if %}");
    assert!(matches!(broken.apply_chat_template(&[], true), Err(TokenizerError::Template(_))));
}

#[test]
fn no_template_and_fallback() {
    let Some(tok) = load(GEMMA3) else { return };
    assert!(matches!(tok.apply_chat_template(&[ChatMessage::user("x")], true), Err(TokenizerError::NoChatTemplate)));
    assert_eq!(
        Tokenizer::fallback_chatml(&[ChatMessage::system("s"), ChatMessage::user("u")], true),
        "<|im_start|>system\ns<|im_end|>\n<|im_start|>user\nu<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn a_template_that_loops_for_ever_is_stopped() {
    use quarrel_tokenizer::ChatTemplate;
    let t = ChatTemplate::new(
        "{% for i in range(10000) %}{% for j in range(10000) %}{% for k in range(10000) %}x{% endfor %}{% endfor %}{% endfor %}",
        "<s>",
        "</s>",
    )
    .unwrap();
    let t0 = std::time::Instant::now();
    let r = t.render(&[ChatMessage::user("hi")], true);
    assert!(r.is_err(), "a render of 10^12 steps must fail");
    assert!(t0.elapsed() < std::time::Duration::from_secs(10), "took {:?}", t0.elapsed());
    // a long real conversation still renders
    let chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}";
    let t = ChatTemplate::new(chatml, "<s>", "</s>").unwrap();
    let msgs: Vec<ChatMessage> = (0..5000).map(|i| ChatMessage::user(format!("message {i}"))).collect();
    assert_eq!(t.render(&msgs, false).unwrap().matches("<|im_end|>").count(), 5000);
}
