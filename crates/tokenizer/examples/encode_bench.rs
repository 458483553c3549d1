//! Times tokenizer loading and encoding/decoding of a text file.
//!
//! cargo run --release -p quarrel-tokenizer --example encode_bench -- MODEL.gguf TEXT_FILE [REPEATS]

use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!("usage: encode_bench MODEL.gguf TEXT_FILE [REPEATS]");
        std::process::exit(2);
    }
    let repeats: usize = args.get(3).and_then(|r| r.parse().ok()).unwrap_or(20);
    let t0 = Instant::now();
    let g = quarrel_gguf::Gguf::open(&args[1])?;
    let tok = quarrel_tokenizer::Tokenizer::from_gguf(&g)?;
    println!("load: {:.1} ms ({} tokens, {:?})", t0.elapsed().as_secs_f64() * 1e3, tok.n_vocab(), tok.kind());
    let text = std::fs::read_to_string(&args[2])?;
    let mut ids = Vec::new();
    let mut best = f64::MAX;
    for _ in 0..repeats {
        let t = Instant::now();
        ids = tok.encode(&text, true, true);
        best = best.min(t.elapsed().as_secs_f64());
    }
    println!(
        "encode: {} bytes -> {} tokens, best of {repeats}: {:.2} ms ({:.1} MB/s)",
        text.len(),
        ids.len(),
        best * 1e3,
        text.len() as f64 / best / 1e6
    );
    let t = Instant::now();
    let back = tok.decode(&ids);
    println!("decode: {:.2} ms, round trip {}", t.elapsed().as_secs_f64() * 1e3, if back == text { "exact" } else { "differs" });
    Ok(())
}
