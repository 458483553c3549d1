use super::*;
use QuantType as T;

fn plan(ft: Ftype, n_layer: usize, n_gqa: usize, tied: bool, nx: u64) -> Vec<(String, Option<QuantType>)> {
    let mut p = MixPlanner::new(ft, MixParams::dense(n_layer, n_gqa, tied));
    let mut names = vec![("token_embd.weight".to_string(), vec![nx, 1000])];
    for i in 0..n_layer {
        for t in ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"] {
            let dims = if t.ends_with("norm") { vec![nx] } else { vec![nx, nx] };
            names.push((format!("blk.{i}.{t}.weight"), dims));
        }
    }
    names.push(("output_norm.weight".into(), vec![nx]));
    if !tied {
        names.push(("output.weight".into(), vec![nx, 1000]));
    }
    names
        .into_iter()
        .map(|(n, d)| {
            let t = p.next(&n, &d);
            (n, t)
        })
        .collect()
}

fn ty(p: &[(String, Option<QuantType>)], name: &str) -> QuantType {
    p.iter().find(|(n, _)| n == name).unwrap().1.unwrap_or(T::F32)
}

#[test]
fn q4_k_m_like_llama_quantize() {
    // 32 layers: use_more_bits is true for 0..4, 28..32 and 6, 9, 12, ..., 27
    let p = plan(Ftype::Q4_K_M, 32, 4, false, 4096);
    assert_eq!(ty(&p, "token_embd.weight"), T::Q4_K);
    assert_eq!(ty(&p, "output.weight"), T::Q6_K);
    assert_eq!(p.iter().find(|(n, _)| n == "output_norm.weight").unwrap().1, None);
    assert_eq!(ty(&p, "blk.0.attn_norm.weight"), T::F32);
    for (i, more) in [(0, true), (3, true), (4, false), (5, false), (6, true), (7, false), (27, true), (28, true), (31, true)] {
        let want = if more { T::Q6_K } else { T::Q4_K };
        assert_eq!(ty(&p, &format!("blk.{i}.attn_v.weight")), want, "layer {i}");
        assert_eq!(ty(&p, &format!("blk.{i}.ffn_down.weight")), want, "layer {i}");
        assert_eq!(ty(&p, &format!("blk.{i}.attn_q.weight")), T::Q4_K);
    }
}

#[test]
fn tied_and_fallbacks() {
    // SmolLM2-135M at Q4_1: tied token_embd -> Q6_K -> (576 % 256) Q8_0, as in the real file
    let p = plan(Ftype::Q4_1, 30, 3, true, 576);
    assert_eq!(ty(&p, "token_embd.weight"), T::Q8_0);
    assert_eq!(ty(&p, "blk.0.attn_q.weight"), T::Q4_1);
    // K types on 576-wide rows fall back
    let p = plan(Ftype::Q4_K_M, 30, 3, true, 576);
    assert_eq!(ty(&p, "blk.1.attn_q.weight"), T::Q5_0);
    assert_eq!(ty(&p, "blk.0.attn_v.weight"), T::Q8_0);
    assert_eq!(ty(&p, "token_embd.weight"), T::Q8_0);
    let p = plan(Ftype::Q2_K, 4, 1, false, 64);
    assert_eq!(ty(&p, "blk.0.attn_q.weight"), T::Q4_0);
    assert_eq!(fallback(T::Q4_0, 40), T::F16);
    let mut m = MixPlanner::new(Ftype::Q4_K_M, MixParams::dense(2, 1, false));
    assert_eq!(m.next_choice("blk.0.attn_q.weight", &[576, 576]), Some(Choice { ty: T::Q5_0, fallback_from: Some(T::Q4_K) }));
    assert_eq!(m.next_choice("blk.0.attn_k.weight", &[512, 576]), Some(Choice { ty: T::Q4_K, fallback_from: None }));
}

#[test]
fn other_mixes() {
    let p = plan(Ftype::Q3_K_M, 32, 8, false, 4096);
    assert_eq!(ty(&p, "blk.1.attn_v.weight"), T::Q5_K);
    assert_eq!(ty(&p, "blk.2.attn_v.weight"), T::Q4_K);
    assert_eq!(ty(&p, "blk.1.ffn_down.weight"), T::Q5_K);
    assert_eq!(ty(&p, "blk.2.ffn_down.weight"), T::Q4_K);
    assert_eq!(ty(&p, "blk.2.attn_output.weight"), T::Q4_K);
    assert_eq!(ty(&p, "blk.2.ffn_up.weight"), T::Q3_K);
    let p = plan(Ftype::Q2_K, 32, 1, false, 4096);
    assert_eq!(ty(&p, "blk.9.attn_v.weight"), T::Q3_K);
    assert_eq!(ty(&p, "blk.9.ffn_up.weight"), T::Q2_K);
    let p = plan(Ftype::Q8_0, 2, 1, true, 4096);
    assert_eq!(ty(&p, "token_embd.weight"), T::Q8_0);
    let p = plan(Ftype::F16, 2, 1, false, 100);
    assert_eq!(ty(&p, "output.weight"), T::F16);
    assert_eq!(ty(&p, "blk.0.ffn_norm.weight"), T::F32);
    assert_eq!(Ftype::from_name("Q4_K_M"), Some(Ftype::Q4_K_M));
    assert_eq!(Ftype::from_name("q4_k"), Some(Ftype::Q4_K_M));
    assert_eq!(Ftype::Q4_K_M.llama_ftype(), 15);
    assert_eq!(Ftype::BF16.llama_ftype(), 32);
}

#[test]
fn overrides_and_kept_tensors() {
    let o = MixOverrides { output: Some(T::Q8_0), token_embd: Some(T::F16), quantize_output: true };
    let mut m = MixPlanner::with_overrides(Ftype::Q4_0, MixParams::dense(2, 1, false), o);
    assert_eq!(m.next("token_embd.weight", &[64, 100]), Some(T::F16));
    assert_eq!(m.next("output.weight", &[64, 100]), Some(T::Q8_0));
    // an override is used as given even in a float file type
    let mut m = MixPlanner::with_overrides(Ftype::F16, MixParams::dense(2, 1, false), o);
    assert_eq!(m.next("output.weight", &[64, 100]), Some(T::Q8_0));
    assert_eq!(m.next("blk.0.attn_q.weight", &[64, 64]), Some(T::F16));
    // tied embeddings follow --output-tensor-type
    let o = MixOverrides { output: Some(T::Q5_0), ..MixOverrides::default() };
    let mut m = MixPlanner::with_overrides(Ftype::Q4_K_M, MixParams::dense(2, 1, true), o);
    assert_eq!(m.next("token_embd.weight", &[256, 100]), Some(T::Q5_0));
    let o = MixOverrides { quantize_output: false, ..MixOverrides::default() };
    let mut m = MixPlanner::with_overrides(Ftype::Q4_0, MixParams::dense(2, 1, false), o);
    assert_eq!(m.next("output.weight", &[64, 100]), None);
    for kept in ["blk.0.ffn_gate_inp.weight", "blk.0.ssm_conv1d.weight", "position_embd.weight", "token_types.weight", "blk.0.attn_q.bias"]
    {
        assert_eq!(m.next(kept, &[64, 64]), None, "{kept}");
    }
    // a 3-D expert tensor is quantized; [64, 1, 1] is 1-D for ggml
    assert_eq!(m.next("blk.0.ffn_up_exps.weight", &[64, 32, 8]), Some(T::Q4_0));
    assert_eq!(m.next("blk.0.attn_q.weight", &[64, 1, 1]), None);
}

#[test]
fn experts_and_70b() {
    let p = MixParams { n_layer: 32, n_gqa: 4, n_expert: 8, n_attn_v: 32, tied_embeddings: false, is_70b: false };
    let mut m = MixPlanner::new(Ftype::Q4_K_M, p);
    assert_eq!(m.next("blk.4.attn_v.weight", &[4096, 1024]), Some(T::Q8_0));
    assert_eq!(m.next("blk.4.attn_k.weight", &[4096, 1024]), Some(T::Q8_0));
    assert_eq!(m.next("blk.4.attn_output.weight", &[4096, 4096]), Some(T::Q5_K));
    // experts: the layer comes from the name, not the count of ffn_down tensors seen
    assert_eq!(m.next("blk.5.ffn_down_exps.weight", &[14336, 4096, 8]), Some(T::Q4_K));
    assert_eq!(m.next("blk.0.ffn_down_exps.weight", &[14336, 4096, 8]), Some(T::Q6_K));
    let p = MixParams { n_layer: 80, n_gqa: 8, n_expert: 0, n_attn_v: 80, tied_embeddings: false, is_70b: true };
    let mut m = MixPlanner::new(Ftype::Q3_K_S, p);
    assert_eq!(m.next("blk.0.attn_v.weight", &[8192, 1024]), Some(T::Q5_K));
}
