//! Continuous batching on hybrid Mamba2 / MoE models (tiny synthetic ones): concurrent
//! requests, each in its own recurrent-state slot, give exactly what each gives alone —
//! also with prompts cut into small chunks interleaved with other requests' decodes, and
//! with more requests than slots (they queue) — and a repeated prompt gives the same
//! output (prefix caching is off for recurrent models).

mod common;
use common::*;
use quarrel_engine::*;
use quarrel_synth::archs::{write_arch_synth, ArchPreset, ArchSynthSpec};
use quarrel_synth::Ftype;

fn greedy(max_tokens: usize) -> GenerateParams {
    GenerateParams { sampling: SamplingParams::greedy(), max_tokens, ignore_eos: true, ..Default::default() }
}

fn drain(s: &mut RequestStream) -> Vec<u32> {
    let mut toks = vec![];
    while let Some(ev) = s.blocking_next() {
        match ev {
            StreamEvent::Token { id, .. } => toks.extend(id),
            StreamEvent::Done { .. } => {}
            StreamEvent::Error(e) => panic!("{e}"),
        }
    }
    toks
}

#[test]
fn concurrent_requests_on_hybrid_models_match_running_alone() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["tiny-granitehybrid", "tiny-nemotron-h-moe"] {
        let path = dir.path().join(format!("{name}.gguf"));
        let spec = ArchSynthSpec { preset: *ArchPreset::by_name(name).unwrap(), ftype: Ftype::Q8_0, seed: 11, vocab_from: None };
        write_arch_synth(&spec, &path, &mut |_, _| {}).unwrap();
        let prompts: Vec<Vec<u32>> = (0..6).map(|i| (0..(5 + 7 * i)).map(|j| (1 + (j * 31 + i * 17) % 500) as u32).collect()).collect();
        let mut alone = engine(&path, EngineOptions { n_ctx: 128, n_seq: 1, ..Default::default() });
        let want: Vec<Vec<u32>> =
            prompts.iter().enumerate().map(|(i, p)| alone.generate(p, &greedy(6 + i), &mut |_| true).unwrap().tokens).collect();
        // all at once; then 2 slots for 6 requests, 8-token prompt chunks, 4-token blocks
        for (n_seq, block_size, chunk) in [(6, 16, 512), (2, 4, 8)] {
            let e = engine(&path, EngineOptions { n_ctx: 64, n_seq, block_size, ..Default::default() });
            let h = EngineHandle::spawn(e, ServiceOptions { prompt_chunk: chunk, max_batch_tokens: chunk.max(32), ..Default::default() });
            let mut streams: Vec<RequestStream> = prompts
                .iter()
                .enumerate()
                .map(|(i, p)| h.submit(Request::new(Prompt::Tokens(p.clone()), greedy(6 + i))).unwrap())
                .collect();
            for (i, s) in streams.iter_mut().enumerate() {
                assert_eq!(drain(s), want[i], "{name} (n_seq {n_seq}, block {block_size}): request {i} differs from running alone");
            }
            // the same prompt again: no stale state, no prefix reuse
            let mut again = h.submit(Request::new(Prompt::Tokens(prompts[3].clone()), greedy(9))).unwrap();
            assert_eq!(drain(&mut again), want[3], "{name}: repeated prompt");
            let m = h.metrics();
            assert_eq!(m.prefix_hit_tokens_total, 0);
            // every token of every request went through each MoE layer: n_used selections each
            let moe_layers: Vec<&Vec<u64>> = m.expert_selections.iter().filter(|r| !r.is_empty()).collect();
            assert!(!moe_layers.is_empty(), "{name}: no expert selections recorded");
            let sums: Vec<u64> = moe_layers.iter().map(|r| r.iter().sum()).collect();
            assert!(sums.iter().all(|&s| s > 0 && s % 2 == 0 && s == sums[0]), "{name}: {sums:?}");
        }
    }
}
