//! `quarrel_synth`: files read back with expected metadata, tensor types and shapes;
//! determinism; numerical sanity of the weights; and (with `LLAMA_CPP_BIN_DIR` set) llama.cpp
//! loading and running the files.

use quarrel_gguf::{Gguf, QuantType};
use quarrel_synth::{presets, tensor_plan, write_synth, Ftype, Preset, SynthSpec, SynthSummary};
use std::path::{Path, PathBuf};

fn tiny() -> Preset {
    *Preset::by_name("tiny").unwrap()
}

fn synth(spec: &SynthSpec, path: &Path) -> SynthSummary {
    let mut last = (0, 0);
    let s = write_synth(spec, path, &mut |d, t| {
        assert!(d >= last.0 && d <= t);
        last = (d, t);
    })
    .unwrap_or_else(|e| panic!("{} {}: {e}", spec.preset.name, spec.ftype));
    assert_eq!(last.0, last.1, "progress must end at the total");
    s
}

fn u(g: &Gguf, k: &str) -> u64 {
    g.get_u64(k).unwrap().unwrap_or_else(|| panic!("missing {k}"))
}

fn f(g: &Gguf, k: &str) -> f64 {
    g.get_f64(k).unwrap().unwrap_or_else(|| panic!("missing {k}"))
}

fn check_file(path: &Path, p: &Preset, ft: Ftype, s: &SynthSummary) -> Gguf {
    check_file_vocab(path, p, ft, s, true)
}

fn check_file_vocab(path: &Path, p: &Preset, ft: Ftype, s: &SynthSummary, synthetic_vocab: bool) -> Gguf {
    let g = Gguf::open(path).unwrap();
    assert_eq!(g.file_size() as u64, s.file_size);
    assert_eq!(std::fs::metadata(path).unwrap().len(), s.file_size);
    assert_eq!(g.architecture().unwrap(), "llama");
    assert_eq!(u(&g, "general.file_type"), ft.llama_ftype() as u64);
    assert_eq!(u(&g, "general.quantization_version"), 2);
    assert_eq!(u(&g, "llama.block_count"), p.n_layer as u64);
    assert_eq!(u(&g, "llama.embedding_length"), p.n_embd as u64);
    assert_eq!(u(&g, "llama.feed_forward_length"), p.n_ff as u64);
    assert_eq!(u(&g, "llama.attention.head_count"), p.n_head as u64);
    assert_eq!(u(&g, "llama.attention.head_count_kv"), p.n_head_kv as u64);
    assert_eq!(u(&g, "llama.context_length"), p.n_ctx as u64);
    assert_eq!(u(&g, "llama.rope.dimension_count"), p.head_dim() as u64);
    assert_eq!(u(&g, "llama.vocab_size"), p.n_vocab as u64);
    assert_eq!(f(&g, "llama.rope.freq_base") as f32, p.rope_freq_base);
    assert_eq!(f(&g, "llama.attention.layer_norm_rms_epsilon") as f32, p.rms_eps);
    assert_eq!(g.get_array("tokenizer.ggml.tokens").unwrap().unwrap().len(), p.n_vocab);
    if synthetic_vocab {
        assert_eq!(g.get_str("tokenizer.ggml.model").unwrap(), Some("llama"));
        assert_eq!(g.get_array("tokenizer.ggml.scores").unwrap().unwrap().len(), p.n_vocab);
        assert_eq!(g.get_array("tokenizer.ggml.token_type").unwrap().unwrap().len(), p.n_vocab);
        assert_eq!(g.get_bool("tokenizer.ggml.add_bos_token").unwrap(), Some(true));
        assert_eq!(u(&g, "tokenizer.ggml.bos_token_id"), 1);
        assert_eq!(u(&g, "tokenizer.ggml.eos_token_id"), 2);
    }

    let plan = tensor_plan(p, ft);
    let expect_n = 1 + 9 * p.n_layer + 1 + usize::from(!p.tied_embeddings);
    assert_eq!(plan.len(), expect_n);
    assert_eq!(g.tensors().len(), expect_n);
    assert_eq!(s.n_tensors, expect_n);
    for (t, info) in plan.iter().zip(g.tensors()) {
        assert_eq!(t.name, info.name);
        assert_eq!(t.dims, info.dims, "{}", t.name);
        assert_eq!(t.ty, info.ty, "{}", t.name);
    }
    // shapes as llama.cpp's llama loader creates them
    let (e, kv, ff, v) = (p.n_embd as u64, p.n_embd_kv() as u64, p.n_ff as u64, p.n_vocab as u64);
    let dims = |n: &str| g.tensor_info(n).unwrap_or_else(|| panic!("missing {n}")).dims.clone();
    assert_eq!(dims("token_embd.weight"), [e, v]);
    assert_eq!(dims("blk.0.attn_q.weight"), [e, e]);
    assert_eq!(dims("blk.0.attn_k.weight"), [e, kv]);
    assert_eq!(dims("blk.0.attn_v.weight"), [e, kv]);
    assert_eq!(dims("blk.0.attn_output.weight"), [e, e]);
    assert_eq!(dims("blk.0.ffn_gate.weight"), [e, ff]);
    assert_eq!(dims("blk.0.ffn_up.weight"), [e, ff]);
    assert_eq!(dims("blk.0.ffn_down.weight"), [ff, e]);
    assert_eq!(dims("output_norm.weight"), [e]);
    assert_eq!(g.tensor_info("output.weight").is_some(), !p.tied_embeddings);
    for t in g.tensors() {
        if t.dims.len() == 1 {
            assert_eq!(t.ty, QuantType::F32, "{}", t.name);
        }
    }
    // Quarrel's own llama config reader accepts it
    let cfg = quarrel_models::arch::llama::Config::from_gguf(&g).unwrap();
    assert_eq!((cfg.dims.n_vocab, cfg.dims.n_layer, cfg.dims.head_dim), (p.n_vocab, p.n_layer, p.head_dim()));
    g
}

fn dequant(g: &Gguf, name: &str) -> Vec<f32> {
    let (info, bytes) = g.tensor(name).unwrap();
    let mut out = vec![0f32; info.n_elements() as usize];
    quarrel_quant::dequantize(info.ty, bytes, &mut out).unwrap();
    out
}

fn mean_std(v: &[f32]) -> (f64, f64) {
    let n = v.len() as f64;
    let m = v.iter().map(|&x| x as f64).sum::<f64>() / n;
    let var = v.iter().map(|&x| (x as f64 - m).powi(2)).sum::<f64>() / n;
    (m, var.sqrt())
}

#[test]
fn tiny_every_ftype_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let p = tiny();
    for &ft in Ftype::ALL {
        let path = dir.path().join(format!("tiny-{ft}.gguf"));
        let s = synth(&SynthSpec::new(p, ft).seed(7), &path);
        let g = check_file(&path, &p, ft, &s);
        // weights have the intended scale after a round trip through the type
        let (m, sd) = mean_std(&dequant(&g, "blk.0.ffn_up.weight"));
        let want = 1.0 / (p.n_embd as f64).sqrt();
        assert!(m.abs() < 0.01 && (sd / want - 1.0).abs() < 0.15, "{ft}: mean {m} std {sd} want {want}");
        let (m, sd) = mean_std(&dequant(&g, "blk.1.ffn_norm.weight"));
        assert!((m - 1.0).abs() < 0.01 && sd < 0.05, "{ft}: norm mean {m} std {sd}");
        std::fs::remove_file(&path).unwrap();
    }
}

#[test]
fn tiny_mix_types() {
    use QuantType as T;
    let p = tiny();
    let ty = |ft: Ftype, name: &str| tensor_plan(&p, ft).into_iter().find(|t| t.name == name).unwrap().ty;
    for (ft, embd, q, v, down, out) in [
        (Ftype::F32, T::F32, T::F32, T::F32, T::F32, T::F32),
        (Ftype::F16, T::F16, T::F16, T::F16, T::F16, T::F16),
        (Ftype::BF16, T::BF16, T::BF16, T::BF16, T::BF16, T::BF16),
        (Ftype::Q8_0, T::Q8_0, T::Q8_0, T::Q8_0, T::Q8_0, T::Q8_0),
        (Ftype::Q4_0, T::Q4_0, T::Q4_0, T::Q4_0, T::Q4_0, T::Q6_K),
        (Ftype::Q4_1, T::Q4_1, T::Q4_1, T::Q4_1, T::Q4_1, T::Q6_K),
        // 2 layers: use_more_bits(0, 2) and (1, 2) are both true
        (Ftype::Q4_K_M, T::Q4_K, T::Q4_K, T::Q6_K, T::Q6_K, T::Q6_K),
        (Ftype::Q4_K_S, T::Q4_K, T::Q4_K, T::Q5_K, T::Q4_K, T::Q6_K),
        (Ftype::Q3_K_M, T::Q3_K, T::Q3_K, T::Q5_K, T::Q4_K, T::Q6_K),
        (Ftype::Q2_K, T::Q2_K, T::Q2_K, T::Q3_K, T::Q3_K, T::Q6_K),
        (Ftype::Q6_K, T::Q6_K, T::Q6_K, T::Q6_K, T::Q6_K, T::Q6_K),
    ] {
        assert_eq!(ty(ft, "token_embd.weight"), embd, "{ft}");
        assert_eq!(ty(ft, "blk.1.attn_q.weight"), q, "{ft}");
        assert_eq!(ty(ft, "blk.1.attn_v.weight"), v, "{ft}");
        assert_eq!(ty(ft, "blk.1.ffn_down.weight"), down, "{ft}");
        assert_eq!(ty(ft, "output.weight"), out, "{ft}");
        assert_eq!(ty(ft, "blk.1.attn_norm.weight"), T::F32, "{ft}");
    }
}

#[test]
fn same_seed_same_bytes_other_seed_other_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let p = tiny();
    for ft in [Ftype::Q4_K_M, Ftype::F16, Ftype::Q8_0] {
        let a = dir.path().join("a.gguf");
        let b = dir.path().join("b.gguf");
        let c = dir.path().join("c.gguf");
        synth(&SynthSpec::new(p, ft).seed(1), &a);
        synth(&SynthSpec::new(p, ft).seed(1), &b);
        synth(&SynthSpec::new(p, ft).seed(2), &c);
        let (a, b, c) = (std::fs::read(a).unwrap(), std::fs::read(b).unwrap(), std::fs::read(c).unwrap());
        assert!(a == b, "{ft}: same seed, different bytes");
        assert_eq!(a.len(), c.len());
        assert!(a != c, "{ft}: different seeds, same bytes");
        // only the description (which names the seed) and the tensor data differ
        let (ga, gc) = (Gguf::from_bytes(a).unwrap(), Gguf::from_bytes(c).unwrap());
        for t in ga.tensors() {
            let ta = ga.tensor_bytes(t);
            let tc = gc.tensor_bytes(gc.tensor_info(&t.name).unwrap());
            assert_ne!(ta, tc, "{ft}: {} did not change with the seed", t.name);
        }
    }
    // chunked generation is independent of the thread count
    let a = dir.path().join("t1.gguf");
    let b = dir.path().join("t2.gguf");
    let spec = SynthSpec::new(p, Ftype::Q4_0).seed(9);
    rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap().install(|| synth(&spec, &a));
    rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap().install(|| synth(&spec, &b));
    assert!(std::fs::read(a).unwrap() == std::fs::read(b).unwrap());
}

#[test]
fn layers_override_and_big_presets_plan() {
    let dir = tempfile::tempdir().unwrap();
    // a real shape with few layers: SmolLM2-135M (tied, 576-wide rows -> fallbacks)
    let p = *Preset::by_name("smollm2-135m").unwrap();
    let path = dir.path().join("smol.gguf");
    let s = synth(&SynthSpec::new(p, Ftype::Q4_K_M).layers(2), &path);
    assert_eq!(s.preset.n_layer, 2);
    let g = check_file(&path, &s.preset, Ftype::Q4_K_M, &s);
    assert_eq!(g.tensor_info("token_embd.weight").unwrap().ty, QuantType::Q8_0);
    assert_eq!(g.tensor_info("blk.1.attn_q.weight").unwrap().ty, QuantType::Q5_0);
    assert_eq!(g.tensor_info("blk.1.ffn_down.weight").unwrap().ty, QuantType::Q6_K);

    // full plans of every preset: parameter counts as published (within 3%)
    for (name, params) in [
        ("smollm2-135m", 134.5e6),
        ("smollm2-360m", 361.8e6),
        ("tinyllama-1.1b", 1.100e9),
        ("llama-3.2-1b", 1.236e9),
        ("llama-2-7b", 6.738e9),
        ("mistral-7b", 7.242e9),
        ("llama-3-8b", 8.030e9),
    ] {
        let p = Preset::by_name(name).unwrap();
        let n: u64 = tensor_plan(p, Ftype::Q4_K_M).iter().map(|t| t.n_elements()).sum();
        assert!((n as f64 / params - 1.0).abs() < 0.03, "{name}: {n} params, published {params}");
    }
    assert!(presets().len() >= 8);
}

#[test]
fn vocab_from_real_model() {
    // the test model CI fetches (scripts/test.sh), else a local copy
    let real = ["QUARREL_SMOLLM2", "QUARREL_TEST_MODEL"]
        .iter()
        .filter_map(std::env::var_os)
        .map(PathBuf::from)
        .chain([PathBuf::from("/work/dl/models/SmolLM2-135M-Instruct.Q4_1.gguf")])
        .find(|p| p.extension().is_some_and(|e| e == "gguf") && p.exists());
    let Some(real) = real else {
        eprintln!("skipped: set QUARREL_SMOLLM2 to a GGUF model with a tokenizer");
        return;
    };
    let real = real.as_path();
    let n_tokens = Gguf::open(real).unwrap().get_array("tokenizer.ggml.tokens").unwrap().unwrap().len();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.gguf");
    let mut spec = SynthSpec::new(tiny(), Ftype::Q8_0);
    spec.vocab_from = Some(real.to_path_buf());
    let s = synth(&spec, &path);
    assert_eq!(s.preset.n_vocab, n_tokens);
    let g = check_file_vocab(&path, &s.preset, Ftype::Q8_0, &s, false);
    let r = Gguf::open(real).unwrap();
    for (k, v) in r.metadata().iter().filter(|(k, _)| k.starts_with("tokenizer.")) {
        assert_eq!(g.get(k), Some(v), "{k}");
    }
    assert_eq!(g.get("tokenizer.ggml.model"), r.get("tokenizer.ggml.model"));
}

/// Single-token forward pass in f32 (position 0: attention returns V): through 24 layers
/// the residual stream and logits stay finite and of moderate size.
#[test]
fn forward_pass_stays_sane_through_depth() {
    let dir = tempfile::tempdir().unwrap();
    let p = tiny();
    let path = dir.path().join("deep.gguf");
    let s = synth(&SynthSpec::new(p, Ftype::F32).layers(24), &path);
    let p = s.preset;
    let g = Gguf::open(&path).unwrap();
    let w = |n: &str| dequant(&g, n);
    let matvec = |m: &[f32], x: &[f32]| -> Vec<f32> { m.chunks(x.len()).map(|r| r.iter().zip(x).map(|(a, b)| a * b).sum()).collect() };
    let rms_norm = |x: &[f32], wt: &[f32]| -> Vec<f32> {
        let s = (x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32 + p.rms_eps).sqrt();
        x.iter().zip(wt).map(|(v, w)| v / s * w).collect()
    };
    let e = p.n_embd;
    let embd = w("token_embd.weight");
    let mut x = embd[300 * e..301 * e].to_vec();
    let hd = p.head_dim();
    for il in 0..p.n_layer {
        let b = |t: &str| w(&format!("blk.{il}.{t}.weight"));
        let h = rms_norm(&x, &b("attn_norm"));
        let v = matvec(&b("attn_v"), &h);
        let per_kv = p.n_head / p.n_head_kv;
        let attn: Vec<f32> = (0..p.n_head).flat_map(|hh| v[(hh / per_kv) * hd..(hh / per_kv + 1) * hd].to_vec()).collect();
        let o = matvec(&b("attn_output"), &attn);
        x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
        let h = rms_norm(&x, &b("ffn_norm"));
        let (gt, up) = (matvec(&b("ffn_gate"), &h), matvec(&b("ffn_up"), &h));
        let act: Vec<f32> = gt.iter().zip(&up).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
        let d = matvec(&b("ffn_down"), &act);
        x.iter_mut().zip(&d).for_each(|(a, b)| *a += b);
    }
    let (_, xs) = mean_std(&x);
    let logits = matvec(&w("output.weight"), &rms_norm(&x, &w("output_norm.weight")));
    let (_, ls) = mean_std(&logits);
    assert!(logits.iter().all(|l| l.is_finite()));
    assert!(xs > 0.01 && xs < 10.0, "residual std {xs}");
    assert!(ls > 0.3 && ls < 3.0, "logit std {ls}");
}

/// llama.cpp loads and runs synthetic files (set LLAMA_CPP_BIN_DIR to the directory of
/// `llama-completion`, e.g. a CPU build's `bin/`).
#[test]
fn llama_cpp_loads_synthetic_models() {
    let Some(dir) = std::env::var_os("LLAMA_CPP_BIN_DIR").map(PathBuf::from) else {
        eprintln!("skipped: set LLAMA_CPP_BIN_DIR to a llama.cpp bin/ directory to run this test");
        return;
    };
    let bin = dir.join("llama-completion");
    assert!(bin.exists(), "{} not found", bin.display());
    let tmp = tempfile::tempdir().unwrap();
    let cases = [
        ("tiny", Ftype::F16),
        ("tiny", Ftype::Q4_0),
        ("tiny", Ftype::Q4_K_M),
        ("tiny", Ftype::Q3_K_M),
        ("tiny", Ftype::Q2_K),
        ("tiny", Ftype::Q5_K_M),
        ("tiny", Ftype::Q6_K),
        ("tiny", Ftype::IQ4_NL),
        ("tiny", Ftype::BF16),
        ("smollm2-135m", Ftype::Q4_0),
    ];
    // A llama.cpp built with GGML_AVX512_BF16=ON dies of SIGILL on BF16 tensors on CPUs
    // without that extension: that is the build, not the file.
    let cpu_bf16 = std::fs::read_to_string("/proc/cpuinfo").map_or(true, |c| c.contains("avx512_bf16"));
    for (preset, ft) in cases {
        if ft == Ftype::BF16 && !cpu_bf16 && std::env::var_os("LLAMA_CPP_BF16").is_none() {
            eprintln!("skipped {preset} {ft}: this CPU has no avx512_bf16 (set LLAMA_CPP_BF16=1 to run it anyway)");
            continue;
        }
        let path = tmp.path().join(format!("{preset}-{ft}.gguf"));
        synth(&SynthSpec::new(*Preset::by_name(preset).unwrap(), ft).seed(3), &path);
        let out = std::process::Command::new(&bin)
            .args(["-m", path.to_str().unwrap(), "-n", "8", "--temp", "0", "-p", "hello", "-no-cnv", "-t", "2"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(40).collect();
        assert!(
            out.status.success(),
            "llama-completion failed on {preset} {ft}: {}\n{}",
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
        eprintln!("llama.cpp ran {preset} {ft}: {:?}", String::from_utf8_lossy(&out.stdout));
    }
}

#[test]
fn row_pool_copies_pool_rows_and_keeps_the_layout() {
    use quarrel_synth::{write_synth_with, WriteOptions};
    let dir = tempfile::tempdir().unwrap();
    let spec = SynthSpec::new(tiny(), Ftype::Q4_K_M).seed(3);
    let (full, pooled) = (dir.path().join("full.gguf"), dir.path().join("pooled.gguf"));
    synth(&spec, &full);
    let pool = 4;
    write_synth_with(&spec, WriteOptions { row_pool: pool }, &pooled, &mut |_, _| {}).unwrap();
    let (gf, gp) = (Gguf::open(&full).unwrap(), Gguf::open(&pooled).unwrap());
    assert_eq!(gf.file_size(), gp.file_size());
    let mut copied = 0;
    for t in gf.tensors() {
        let tp = gp.tensor_info(&t.name).unwrap();
        assert_eq!((t.ty, &t.dims, t.offset), (tp.ty, &tp.dims, tp.offset), "{}", t.name);
        let (a, b) = (gf.tensor_bytes(t), gp.tensor_bytes(tp));
        let row = t.ty.row_bytes(t.dims[0] as usize).unwrap();
        let n_rows = a.len() / row;
        if n_rows <= pool {
            assert!(a == b, "{}: small tensors are drawn in full", t.name);
            continue;
        }
        // the pool is the full file's first rows; every other row is one of them
        assert!(a[..pool * row] == b[..pool * row], "{}", t.name);
        for r in pool..n_rows {
            let got = &b[r * row..(r + 1) * row];
            assert!((0..pool).any(|k| got == &b[k * row..(k + 1) * row]), "{} row {r} is not a pool row", t.name);
            copied += 1;
        }
    }
    assert!(copied > 0);
}
