//! Structured output on the GPU through the engine's service: constrained requests' masks are
//! computed on host threads during the forward and applied by the device sampler. On a q8_0
//! synthetic model with exact numerics (the CPU's logits bit for bit), the GPU's picks are the
//! CPU's, for constrained, biased and plain requests in one batch. Needs a CUDA device:
//! ignored unless asked for (scripts/gpu-test.sh).

mod common;
use common::{cuda, tmpdir};
use quarrel_core::Backend;
use quarrel_cpu::CpuBackend;
use quarrel_engine::*;
use quarrel_synth::{write_synth, Ftype, Preset, SynthSpec};

fn run<B: Backend + Send + 'static>(be: B, path: &std::path::Path, reqs: &[Request]) -> Vec<(Vec<u32>, String, FinishReason)> {
    let e = Engine::load(be, path, EngineOptions { n_ctx: 128, n_seq: reqs.len(), ..Default::default() }).unwrap();
    let h = EngineHandle::spawn(e, ServiceOptions::default());
    let mut streams: Vec<RequestStream> = reqs.iter().map(|r| h.submit(r.clone()).unwrap()).collect();
    streams
        .iter_mut()
        .map(|s| {
            let (mut toks, mut text, mut fin) = (vec![], String::new(), None);
            while let Some(ev) = s.blocking_next() {
                match ev {
                    StreamEvent::Token { id, text: t, .. } => {
                        toks.extend(id);
                        text.push_str(&t);
                    }
                    StreamEvent::Done { finish_reason, .. } => fin = Some(finish_reason),
                    StreamEvent::Error(e) => panic!("{e}"),
                }
            }
            (toks, text, fin.unwrap())
        })
        .collect()
}

#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-test.sh)"]
fn constrained_picks_on_the_gpu_are_the_cpus() {
    let gpu = cuda();
    gpu.set_numerics(quarrel_core::Numerics::Exact);
    let dir = tmpdir("constrained");
    let path = dir.join("tiny-q8_0.gguf");
    write_synth(&SynthSpec::new(*Preset::by_name("tiny").unwrap(), Ftype::Q8_0).seed(3), &path, &mut |_, _| {}).unwrap();
    let sampled = |seed| SamplingParams { temperature: 0.8, top_k: 40, top_p: 0.95, seed, ..Default::default() };
    let digits = ConstraintSpec::Regex("[0-9]{2,8}".into());
    let words = ConstraintSpec::Regex("[a-z]{1,6}( [a-z]{1,6}){1,3}".into());
    let mut reqs = vec![];
    for i in 0..12u64 {
        let prompt: Vec<u32> = (0..5 + i as u32).map(|t| (t * 37 + 11 * i as u32) % 200 + 3).collect();
        let sampling = if i % 4 == 3 { SamplingParams::greedy() } else { sampled(i) };
        let logit_bias = if i % 5 == 2 { vec![(40, 6.0), (7, -100.0)] } else { vec![] };
        let mut r = Request::new(Prompt::Tokens(prompt), GenerateParams { sampling, max_tokens: 20, logit_bias, ..Default::default() });
        r.constraint = match i % 3 {
            0 => Some(digits.clone()),
            1 => Some(words.clone()),
            _ => None,
        };
        reqs.push(r);
    }
    let on_gpu = run(gpu, &path, &reqs);
    let on_cpu = run(CpuBackend::new(0).unwrap(), &path, &reqs);
    let mut same = 0;
    for (i, (g, c)) in on_gpu.iter().zip(&on_cpu).enumerate() {
        eprintln!("{i}: gpu {:?} {:?} | cpu {:?} {:?}", g.1, g.2, c.1, c.2);
        if i % 3 == 0 {
            assert!(g.1.len() >= 2 && g.1.bytes().all(|b| b.is_ascii_digit()), "request {i}: {:?}", g.1);
        }
        if i % 3 == 1 {
            assert!(g.1.split(' ').all(|w| !w.is_empty() && w.bytes().all(|b| b.is_ascii_lowercase())), "request {i}: {:?}", g.1);
        }
        same += (g == c) as usize;
    }
    // a sampled pick may part where the draw lies within a few ulp of a cumulative
    // probability (CUDA's expf vs libm's): at most one request
    assert!(same + 1 >= reqs.len(), "only {same} of {} requests alike on GPU and CPU", reqs.len());
    let _ = std::fs::remove_dir_all(&dir);
}
