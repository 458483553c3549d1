//! Decode attention kernel speed (single thread, best of N): `attn_speed [CTX] [HEAD_DIM] [HEADS_PER_KV] [REPS]`.
//! One query token over CTX cached f16 positions in 16-position runs (the paged cache's
//! blocks), `simd::attn::vec_f16_run_multi` as the CPU backend calls it. A benchmark that
//! prints figures, not a test.
use half::f16;
use quarrel_cpu::simd::attn::{self, Online, Run, Scoring};
use std::time::Instant;

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let arg = |i: usize, d: usize| a.get(i).and_then(|v| v.parse().ok()).unwrap_or(d);
    let (ctx, hd, g, reps) = (arg(1, 256), arg(2, 64), arg(3, 3), arg(4, 2000));
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    let k: Vec<f16> = (0..ctx * hd).map(|_| f16::from_f32(rnd() * 4.0)).collect();
    let v: Vec<f16> = (0..ctx * hd).map(|_| f16::from_f32(rnd() * 2.0)).collect();
    let qs: Vec<Vec<f32>> = (0..g).map(|_| (0..hd).map(|_| f16::from_f32(rnd() * 4.0).to_f32()).collect()).collect();
    let q: Vec<&[f32]> = qs.iter().map(|x| &x[..]).collect();
    let sc = Scoring { scale: 1.0 / (hd as f32).sqrt(), softcap: None };
    let mut accs = vec![vec![0f32; hd]; g];
    let mut best = f64::MAX;
    let mut check = 0f32;
    for _ in 0..reps {
        let t = Instant::now();
        let mut st = vec![Online::START; g];
        accs.iter_mut().for_each(|a| a.fill(0.0));
        let mut j = 0;
        while j < ctx {
            let len = 16.min(ctx - j);
            let mut acc: Vec<&mut [f32]> = accs.iter_mut().map(|x| &mut x[..]).collect();
            attn::vec_f16_run_multi(&q, &k, &v, Run { start: j * hd, stride: hd, len }, sc, &mut st, &mut acc);
            j += len;
        }
        best = best.min(t.elapsed().as_secs_f64());
        check = st[0].s + accs[0][0];
    }
    println!(
        "ctx {ctx} hd {hd} heads {g}: best {:.2} us, {:.2} ns per head-position (check {check})",
        best * 1e6,
        best * 1e9 / (ctx * g) as f64
    );
}
