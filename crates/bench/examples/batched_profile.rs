//! Where a parallel-decode step goes, by op, for several thread counts side by side:
//! `batched_profile MODEL [THREADS,...] [PL] [NPP] [NTG] [ROUNDS]`
//! (defaults `1,2 16 128 64 2`). Runs llama-batched-bench's protocol (`BatchedBench::bench_batched`)
//! on a [`ProfiledBackend`] over the CPU backend, counting only the generation phase, the
//! thread counts alternating round by round (the machine's load changes; only ratios from
//! one run mean anything). Prints ms per decode step by op kind, the best round per thread
//! count; with one thread ops are timed by the thread's CPU time and the step total is too
//! (what the busy machine's scheduling does not inflate). A benchmark, not a test.
use quarrel_bench::{BatchedBench, OpKind, ProfiledBackend};
use quarrel_cpu::CpuBackend;
use quarrel_engine::{Engine, EngineOptions};
use std::collections::BTreeMap;
use std::time::Duration;

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let Some(model) = a.get(1) else {
        eprintln!("usage: batched_profile MODEL [THREADS,...] [PL] [NPP] [NTG] [ROUNDS]");
        std::process::exit(2);
    };
    let threads: Vec<usize> = a.get(2).map_or(vec![1, 2], |v| v.split(',').filter_map(|x| x.parse().ok()).collect());
    let arg = |i: usize, d: usize| a.get(i).and_then(|v| v.parse().ok()).unwrap_or(d);
    let (pl, npp, ntg, rounds) = (arg(3, 16), arg(4, 128), arg(5, 64), arg(6, 2));
    let gguf = std::sync::Arc::new(quarrel_gguf::Gguf::open(std::path::Path::new(model)).expect("opening the model"));
    let mut engines: Vec<_> = threads
        .iter()
        .map(|&t| {
            let block_size =
                std::env::var("QUARREL_BLOCK_SIZE").ok().and_then(|v| v.parse().ok()).unwrap_or(EngineOptions::default().block_size);
            let opts = EngineOptions { n_ctx: npp + ntg, n_seq: pl, block_size, ..Default::default() };
            // one thread: time ops by its CPU time (robust on a busy machine), else wall time
            let be = CpuBackend::new(t).unwrap();
            let be = if t == 1 { ProfiledBackend::with_clock(be, quarrel_cpu::pool::thread_cpu_time) } else { ProfiledBackend::new(be) };
            let mut e = Engine::from_gguf(be, gguf.clone(), opts).expect("loading");
            e.bench_batched(16, 4, pl).expect("warm-up");
            e
        })
        .collect();
    // per thread count: (best step ms, its per-op table, pool counters over the phase)
    type Best = (f64, Vec<(OpKind, u64, Duration)>, [u64; 8]);
    let mut best: Vec<Option<Best>> = vec![None; threads.len()];
    let pool = |b: &ProfiledBackend<CpuBackend>| {
        let p = b.inner.pool_stats();
        [p.runs, p.tasks, p.caller_work_ns, p.caller_wait_ns, p.worker_work_ns, p.worker_start_ns, p.caller_cpu_ns, p.worker_cpu_ns]
    };
    for _ in 0..rounds {
        for (i, e) in engines.iter_mut().enumerate() {
            let mut p0 = [0u64; 8];
            let mut c0 = Duration::ZERO;
            let r = e
                .bench_batched_with(npp, ntg, pl, &mut |b| {
                    b.reset();
                    p0 = pool(b);
                    c0 = quarrel_cpu::pool::thread_cpu_time();
                })
                .expect("bench");
            let c1 = quarrel_cpu::pool::thread_cpu_time();
            let p1 = pool(&e.backend);
            let t_tg = if threads[i] == 1 { (c1 - c0).as_secs_f64() } else { r.t_tg };
            let step = t_tg * 1e3 / ntg as f64;
            if best[i].as_ref().is_none_or(|(s, _, _)| step < *s) {
                let st = e.backend.stats().into_iter().map(|(k, s)| (k, s.calls, s.time)).collect();
                best[i] = Some((step, st, std::array::from_fn(|k| p1[k] - p0[k])));
            }
        }
    }
    let mut rows: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut order: Vec<String> = vec![];
    for (i, b) in best.iter().enumerate() {
        let (step, st, _) = b.as_ref().unwrap();
        let mut in_ops = 0.0;
        for (k, calls, t) in st {
            let name = format!("{k} ({:.0}/step)", *calls as f64 / ntg as f64);
            let ms = t.as_secs_f64() * 1e3 / ntg as f64;
            in_ops += ms;
            if !rows.contains_key(&name) {
                order.push(name.clone());
            }
            rows.entry(name).or_insert_with(|| vec![0.0; threads.len()])[i] = ms;
        }
        let outside = "(between ops)".to_string();
        if !rows.contains_key(&outside) {
            order.push(outside.clone());
        }
        rows.entry(outside).or_insert_with(|| vec![0.0; threads.len()])[i] = step - in_ops;
        let total = "step".to_string();
        if !rows.contains_key(&total) {
            order.push(total.clone());
        }
        rows.entry(total).or_insert_with(|| vec![0.0; threads.len()])[i] = *step;
    }
    println!("pl {pl}, npp {npp}, ntg {ntg}: ms per decode step (best of {rounds} rounds)\n");
    print!("| {:<40} |", "op");
    threads.iter().for_each(|t| print!(" -t {t:<5} |"));
    println!(" ratio first/last |");
    for name in &order {
        let v = &rows[name];
        print!("| {name:<40} |");
        v.iter().for_each(|x| print!(" {x:>8.3} |"));
        println!(" {:>16.2} |", v[0] / v.last().unwrap().max(1e-9));
    }
    if std::env::var_os("QUARREL_CPU_PROFILE").is_some() {
        println!("\nthread pool per decode step (QUARREL_CPU_PROFILE):\n");
        for (t, b) in threads.iter().zip(&best) {
            let p = b.as_ref().unwrap().2;
            let per = |x: u64| x as f64 / ntg as f64;
            let ms = |x: u64| per(x) / 1e6;
            println!(
                "-t {t}: {:.0} regions, {:.0} tasks; caller: tasks {:.3} ms ({:.3} ms thread CPU time), waiting {:.3} ms; workers: tasks {:.3} ms ({:.3} ms CPU), start latency {:.3} ms ({:.2} us per region)",
                per(p[0]), per(p[1]), ms(p[2]), ms(p[6]), ms(p[3]), ms(p[4]), ms(p[7]), ms(p[5]), per(p[5]) / 1e3 / per(p[0]).max(1.0) / (*t as f64 - 1.0).max(1.0)
            );
        }
    }
}
