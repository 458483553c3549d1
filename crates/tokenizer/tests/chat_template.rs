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
