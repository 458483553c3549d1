//! Debug aid: greedy-decode from token ids given on the command line (no tokenizer needed).
//! `cargo run --release -p quarrel-models --example greedy_ids -- MODEL N ID...`

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 4 {
        eprintln!("usage: greedy_ids MODEL N ID...");
        std::process::exit(2);
    }
    let g = std::sync::Arc::new(quarrel_gguf::Gguf::open(&a[1]).expect("open"));
    let n: usize = a[2].parse().expect("N");
    let mut ids: Vec<u32> = a[3..].iter().map(|s| s.parse().expect("id")).collect();
    let be = quarrel_cpu::CpuBackend::new(0).expect("backend");
    let m = quarrel_models::load(&be, &g).expect("load");
    let info = m.info().clone();
    let spec = quarrel_core::KvSpec { n_layer: info.n_layer, n_kv_head: info.n_kv_head, head_dim: info.head_dim, block_size: 16, n_blocks: 64, ty: quarrel_core::KvType::F16 };
    let mut kv = quarrel_core::Backend::alloc_kv(&be, &spec).expect("kv");
    let table: Vec<u32> = (0..64).collect();
    let mut pos = 0;
    let mut batch_toks = ids.clone();
    let t0 = std::time::Instant::now();
    for step in 0..n {
        let b = quarrel_core::ForwardBatch {
            tokens: batch_toks.clone(),
            positions: (pos..pos + batch_toks.len() as u32).collect(),
            seqs: vec![quarrel_core::SeqBatch { start: 0, len: batch_toks.len(), block_table: table.clone() }],
            logits_rows: vec![batch_toks.len() - 1],
            state_slots: vec![],
        };
        let logits = m.forward(&be, &b, &mut kv).expect("forward");
        pos += batch_toks.len() as u32;
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
