//! `cargo fuzz run chat_template`: any template source (model files carry their own) with any
//! message text compiles and renders to a string or an error: never a panic, never a hang
//! (renders run on a fuel budget). Input: template bytes, a 0 byte, message bytes.
#![no_main]
use quarrel_tokenizer::{ChatMessage, ChatTemplate};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let cut = data.iter().position(|&b| b == 0).unwrap_or(data.len());
    let source = String::from_utf8_lossy(&data[..cut]);
    let content = String::from_utf8_lossy(data.get(cut + 1..).unwrap_or_default());
    let Ok(t) = ChatTemplate::new(&source, "<s>", "</s>") else { return };
    let msgs =
        [ChatMessage::system(content.to_string()), ChatMessage::user(content.to_string()), ChatMessage::assistant(content.to_string())];
    let _ = t.render(&msgs, true);
    let _ = t.render(&msgs[1..2], false);
});
