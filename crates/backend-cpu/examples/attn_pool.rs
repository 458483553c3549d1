//! Decode attention over a paged f16 cache as a decode step reads it (single thread):
//! `attn_pool [SEQS] [CTX] [LAYERS] [MODE] [REPS]`. Every layer has its own cache pool of
//! `[block][kv_head][slot][head_dim]` blocks of 16 positions handed out in a shuffled order,
//! so K/V come from memory as in a step (not from L1/L2 as in `attn_speed`). MODE: how the
//! next block is prefetched (0 none, 1 the next block's K and V runs at the block start, 2 two
//! blocks ahead, 3 the next block with `prefetcht1`, 4 as 1 and the next task's first block during a task's last). Prints ns per head-position (thread CPU
//! time: a busy machine's scheduling does not count). `HUGE=1`: the pools on huge pages. A benchmark.
use half::f16;
use quarrel_cpu::simd::attn::{self, Online, Run, Scoring};

/// One layer's K and V pools and its sequences' block tables.
type Pool = (&'static mut [f16], &'static mut [f16], Vec<Vec<usize>>);

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let arg = |i: usize, d: usize| a.get(i).and_then(|v| v.parse().ok()).unwrap_or(d);
    let (seqs, ctx, layers, mode, reps) = (arg(1, 16), arg(2, 192), arg(3, 30), arg(4, 1), arg(5, 5));
    let (hd, nkv, g, bs) = (64usize, 3usize, 3usize, 16usize);
    let bpseq = ctx.div_ceil(bs);
    let nb = seqs * bpseq;
    let block = nkv * bs * hd;
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let huge = std::env::var_os("HUGE").is_some();
    let pools: Vec<Pool> = (0..layers)
        .map(|_| {
            let k = alloc(nb * block, huge);
            k.iter_mut().enumerate().for_each(|(i, x)| *x = f16::from_f32(((i * 37 % 101) as f32 - 50.0) / 40.0));
            let v = alloc(nb * block, huge);
            v.iter_mut().enumerate().for_each(|(i, x)| *x = f16::from_f32(((i * 53 % 97) as f32 - 48.0) / 50.0));
            let mut ids: Vec<usize> = (0..nb).collect();
            for i in (1..nb).rev() {
                ids.swap(i, (rnd() % (i as u64 + 1)) as usize);
            }
            let tables = ids.chunks(bpseq).map(|c| c.to_vec()).collect();
            (k, v, tables)
        })
        .collect();
    let qs: Vec<Vec<f32>> =
        (0..g).map(|h| (0..hd).map(|d| f16::from_f32(((h * 7 + d) % 13) as f32 / 6.0 - 1.0).to_f32()).collect()).collect();
    let q: Vec<&[f32]> = qs.iter().map(|x| &x[..]).collect();
    let sc = Scoring { scale: 1.0 / (hd as f32).sqrt(), softcap: None };
    let mut accs = vec![vec![0f32; hd]; g];
    let mut best = f64::MAX;
    let mut check = 0f32;
    let off = |tab: &[usize], j: usize, kvh: usize| tab[j / bs] * block + kvh * bs * hd + (j % bs) * hd;
    for _ in 0..reps {
        let t = quarrel_cpu::pool::thread_cpu_time();
        for (k, v, tables) in &pools {
            for (ti, tab) in tables.iter().enumerate() {
                for kvh in 0..nkv {
                    // mode 4: the next task's first block (kvh + 1, or the next sequence's first KV head)
                    let next = if kvh + 1 < nkv { Some((tab, kvh + 1)) } else { tables.get(ti + 1).map(|t| (t, 0)) };
                    let mut st = vec![Online::START; g];
                    accs.iter_mut().for_each(|a| a.fill(0.0));
                    let mut j = 0;
                    while j < ctx {
                        let len = bs.min(ctx - j);
                        let ahead = match mode {
                            2 => 2 * bs,
                            _ => bs,
                        };
                        if mode == 4 && j + ahead >= ctx {
                            if let Some((nt, nk)) = next {
                                let at = off(nt, 0, nk);
                                attn::prefetch(k, at, bs * hd);
                                attn::prefetch(v, at, bs * hd);
                            }
                        }
                        if mode != 0 && j + ahead < ctx {
                            let n = bs.min(ctx - j - ahead) * hd;
                            let at = off(tab, j + ahead, kvh);
                            if mode == 3 {
                                prefetch_t1(k, at, n);
                                prefetch_t1(v, at, n);
                            } else {
                                attn::prefetch(k, at, n);
                                attn::prefetch(v, at, n);
                            }
                        }
                        let mut acc: Vec<&mut [f32]> = accs.iter_mut().map(|x| &mut x[..]).collect();
                        attn::vec_f16_run_multi(&q, k, v, Run { start: off(tab, j, kvh), stride: hd, len }, sc, &mut st, &mut acc);
                        j += len;
                    }
                    check += st[0].s + accs[0][0];
                }
            }
        }
        best = best.min((quarrel_cpu::pool::thread_cpu_time() - t).as_secs_f64());
    }
    let hp = (layers * seqs * nkv * ctx * g) as f64;
    println!(
        "mode {mode}: {seqs} seqs x ctx {ctx} x {layers} layers: best {:.3} ms, {:.2} ns per head-position (check {check})",
        best * 1e3,
        best * 1e9 / hp
    );
}

/// `n` f16 of fresh anonymous memory (leaked), with `MADV_HUGEPAGE` asked before the first touch.
fn alloc(n: usize, huge: bool) -> &'static mut [f16] {
    let bytes = (n * 2).next_multiple_of(2 << 20) + (2 << 20);
    // SAFETY: anonymous private mapping; checked below.
    let p = unsafe {
        libc::mmap(std::ptr::null_mut(), bytes, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
    };
    assert!(p != libc::MAP_FAILED);
    let a = (p as usize).next_multiple_of(2 << 20);
    if huge {
        // SAFETY: inside the mapping.
        unsafe { libc::madvise(a as *mut libc::c_void, bytes - (a - p as usize), libc::MADV_HUGEPAGE) };
    }
    // SAFETY: zeroed memory of at least n f16 from `a`, never unmapped.
    unsafe { std::slice::from_raw_parts_mut(a as *mut f16, n) }
}

fn prefetch_t1(x: &[f16], start: usize, n: usize) {
    let end = (start + n).min(x.len());
    let p = x[start..end].as_ptr() as *const i8;
    for o in (0..(end - start) * 2).step_by(64) {
        // SAFETY: a prefetch of an address inside `x`.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(p.add(o)) };
    }
}
