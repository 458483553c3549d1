//! Manual runs of `write_synth` without the CLI (ignored by default):
//!
//! ```text
//! SYNTH_PRESET=tinyllama-1.1b SYNTH_QUANT=q4_0 SYNTH_OUT=/tmp/t.gguf \
//!     cargo test --release -p quarrel-synth --test synth_bench -- --ignored --nocapture
//! ```
//! Optional: SYNTH_SEED, SYNTH_LAYERS, SYNTH_VOCAB_FROM.

use quarrel_synth::{write_synth, Ftype, Preset, SynthSpec};
use std::path::PathBuf;

fn env(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.is_empty())
}

#[test]
#[ignore]
fn synth_from_env() {
    let preset = env("SYNTH_PRESET").unwrap_or_else(|| "tinyllama-1.1b".into());
    let quant = env("SYNTH_QUANT").unwrap_or_else(|| "q4_0".into());
    let out = PathBuf::from(env("SYNTH_OUT").unwrap_or_else(|| format!("/tmp/synth-{preset}-{quant}.gguf")));
    let mut spec = SynthSpec::new(*Preset::by_name(&preset).expect("unknown preset"), Ftype::from_name(&quant).expect("unknown quant"));
    spec.seed = env("SYNTH_SEED").map_or(0, |s| s.parse().unwrap());
    spec.n_layer_override = env("SYNTH_LAYERS").map(|s| s.parse().unwrap());
    spec.vocab_from = env("SYNTH_VOCAB_FROM").map(PathBuf::from);
    let mut last_pct = 0;
    let s = write_synth(&spec, &out, &mut |d, t| {
        let pct = d * 10 / t.max(1);
        if pct != last_pct {
            eprint!("{}% ", pct * 10);
            last_pct = pct;
        }
    })
    .unwrap();
    eprintln!();
    println!(
        "{}: {} {} — {:.1}M params, {} tensors {:?}, {:.1} MiB, {:.2} s on {} rayon threads",
        out.display(),
        s.preset.name,
        s.ftype,
        s.n_params as f64 / 1e6,
        s.n_tensors,
        s.type_counts.iter().map(|(t, n)| format!("{n} {t}")).collect::<Vec<_>>(),
        s.file_size as f64 / (1u64 << 20) as f64,
        s.seconds,
        rayon::current_num_threads()
    );
}

/// Single-thread cost per element of drawing normals and of quantizing to a few types.
#[test]
#[ignore]
fn synth_cost_per_element() {
    use quarrel_gguf::QuantType;
    use quarrel_synth::rng::SplitMix64;
    use std::time::Instant;
    let n = 1 << 22;
    let mut v = vec![0f32; n];
    let t = Instant::now();
    SplitMix64::new(1).fill_normal(&mut v, 0.0, 0.02);
    println!("normal: {:.2} ns/elem", t.elapsed().as_secs_f64() * 1e9 / n as f64);
    // baseline: Box-Muller on f64 libm ln / sin_cos
    let mut r = SplitMix64::new(1);
    let t = Instant::now();
    for p in v.chunks_exact_mut(2) {
        let u1 = ((r.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64;
        let u2 = (r.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        let rr = (-2.0 * u1.ln()).sqrt();
        let (s, c) = (std::f64::consts::TAU * u2).sin_cos();
        p[0] = (rr * c) as f32 * 0.02;
        p[1] = (rr * s) as f32 * 0.02;
    }
    println!("normal (libm f64 baseline): {:.2} ns/elem", t.elapsed().as_secs_f64() * 1e9 / n as f64);
    let t = Instant::now();
    SplitMix64::new(1).fill_normal(&mut v, 0.0, 0.02);
    println!("normal again: {:.2} ns/elem", t.elapsed().as_secs_f64() * 1e9 / n as f64);
    for ty in [QuantType::F16, QuantType::Q4_0, QuantType::Q8_0, QuantType::Q4_K, QuantType::Q6_K, QuantType::Q3_K, QuantType::Q2_K] {
        let mut out = vec![0u8; ty.row_bytes(n).unwrap()];
        let t = Instant::now();
        for (src, dst) in v.chunks(4096).zip(out.chunks_mut(ty.row_bytes(4096).unwrap())) {
            quarrel_quant::quantize(ty, src, dst).unwrap();
        }
        println!("{ty}: {:.2} ns/elem", t.elapsed().as_secs_f64() * 1e9 / n as f64);
    }
}
