//! Debug aid: greedy-decode from token ids given on the command line (no tokenizer needed).
//! `cargo run --release -p quarrel-models --example greedy_ids -- MODEL N ID...`

mod common;

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 4 {
        eprintln!("usage: greedy_ids MODEL N ID...");
        std::process::exit(2);
    }
    let n: usize = a[2].parse().expect("N");
    let mut ids: Vec<u32> = a[3..].iter().map(|s| s.parse().expect("id")).collect();
    let mut run = common::Session::open(&a[1]);
    let mut batch_toks = ids.clone();
    let t0 = std::time::Instant::now();
    for step in 0..n {
        let logits = run.forward(&batch_toks, vec![batch_toks.len() - 1]);
        let mut best = 0;
        for (i, &v) in logits.iter().enumerate() {
            if v > logits[best] {
                best = i;
            }
        }
        if step == 0 {
            eprintln!("prefill {:?}", t0.elapsed());
        }
        ids.push(best as u32);
        batch_toks = vec![best as u32];
    }
    eprintln!("total {:?}", t0.elapsed());
    println!("{:?}", &ids);
}
