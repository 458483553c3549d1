//! `cargo fuzz run gguf_parse`: any byte string parses to a GGUF or an error, never a panic.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = quarrel_gguf::Gguf::validate(data);
    let _ = quarrel_gguf::Gguf::from_bytes(data.to_vec());
});
