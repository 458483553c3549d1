//! Debug aid for golden diffs: run PROMPT ids in one batch, then FORCED ids one at a time (as a
//! decode loop does), and write every position's logits as raw f32 to OUT.
//! `cargo run --release -p quarrel-models --example dump_logits -- MODEL '[ids]' '[forced]' OUT`

mod common;

fn parse(s: &str) -> Vec<u32> {
    s.trim_matches(|c| c == '[' || c == ']').split(',').filter(|x| !x.trim().is_empty()).map(|x| x.trim().parse().expect("id")).collect()
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() != 5 {
        eprintln!("usage: dump_logits MODEL '[prompt ids]' '[forced ids]' OUT");
        std::process::exit(2);
    }
    let prompt = parse(&a[2]);
    let forced = parse(&a[3]);
    let mut run = common::Session::open(&a[1]);
    let mut all = vec![];
    let mut chunks = vec![prompt];
    chunks.extend(forced.iter().map(|&t| vec![t]));
    for c in chunks {
        all.extend(run.forward(&c, (0..c.len()).collect()));
    }
    let bytes: Vec<u8> = all.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(&a[4], bytes).expect("write");
}
