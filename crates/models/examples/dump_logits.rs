//! Debug aid for golden diffs: run PROMPT ids in one batch, then FORCED ids one at a time (as a
//! decode loop does), and write every position's logits as raw f32 to OUT.
//! `cargo run --release -p quarrel-models --example dump_logits -- MODEL '[ids]' '[forced]' OUT`

fn parse(s: &str) -> Vec<u32> {
    s.trim_matches(|c| c == '[' || c == ']').split(',').filter(|x| !x.trim().is_empty()).map(|x| x.trim().parse().expect("id")).collect()
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() != 5 {
        eprintln!("usage: dump_logits MODEL '[prompt ids]' '[forced ids]' OUT");
        std::process::exit(2);
    }
    let g = std::sync::Arc::new(quarrel_gguf::Gguf::open(&a[1]).expect("open"));
    let prompt = parse(&a[2]);
    let forced = parse(&a[3]);
    let be = quarrel_cpu::CpuBackend::new(0).expect("backend");
    let m = quarrel_models::load(&be, &g).expect("load");
    let info = m.info().clone();
    let spec = quarrel_core::KvSpec { n_layer: info.n_layer, n_kv_head: info.n_kv_head, head_dim: info.head_dim, block_size: 16, n_blocks: 64, ty: quarrel_core::KvType::F16 };
    let mut kv = quarrel_core::Backend::alloc_kv(&be, &spec).expect("kv");
    let table: Vec<u32> = (0..64).collect();
    let mut all = vec![];
    let mut pos = 0u32;
    let mut chunks = vec![prompt.clone()];
    chunks.extend(forced.iter().map(|&t| vec![t]));
    for c in chunks {
        let b = quarrel_core::ForwardBatch {
            tokens: c.clone(),
            positions: (pos..pos + c.len() as u32).collect(),
            seqs: vec![quarrel_core::SeqBatch { start: 0, len: c.len(), block_table: table.clone() }],
            logits_rows: (0..c.len()).collect(),
            state_slots: vec![],
        };
        all.extend(m.forward(&be, &b, &mut kv).expect("forward"));
        pos += c.len() as u32;
    }
    let bytes: Vec<u8> = all.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(&a[4], bytes).expect("write");
}
