//! Where the GPU's logits part from the CPU backend's, per position: one prefill and token by
//! token on each backend, NMSE of every pair. With `QUARREL_TRACE=all,row=<n_embd>`
//! the models' traced intermediates of the four runs are printed between `=== <run>` markers
//! (stderr), for `scripts/trace-diff.py` to name the first op that diverges.
//!
//! ```text
//! cargo run --release -p quarrel-cuda --example numerics_compare -- MODEL.gguf [--exact] [--tokens 1,2,3]
//! ```

use quarrel_cpu::CpuBackend;
use quarrel_cuda::CudaBackend;
use quarrel_engine::{Engine, EngineOptions};

fn nmse(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum();
    num / den.max(1e-30)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = args.first().ok_or("usage: numerics_compare MODEL.gguf [--exact] [--tokens 1,2,3]")?;
    let exact = args.iter().any(|a| a == "--exact");
    let ids: Vec<u32> = match args.iter().position(|a| a == "--tokens") {
        Some(i) => args.get(i + 1).ok_or("--tokens needs a list")?.split(',').map(|t| t.parse()).collect::<Result<_, _>>()?,
        None => (0..24).map(|i| (i * 37 + 5) % 500).collect(),
    };
    let opts = |n_batch| EngineOptions { n_ctx: 256, n_batch, ..Default::default() };
    let mut runs = Vec::new();
    for (name, n_batch, gpu) in [("cpu prefill", 512, false), ("cpu decode", 1, false), ("gpu prefill", 512, true), ("gpu decode", 1, true)]
    {
        eprintln!("=== {name}");
        let logits = if gpu {
            let be = CudaBackend::new(0)?;
            be.set_numerics(if exact { quarrel_core::Numerics::Exact } else { quarrel_core::Numerics::Fast });
            Engine::load(be, path.as_ref(), opts(n_batch))?.eval_all(&ids)?
        } else {
            Engine::load(CpuBackend::new(0)?, path.as_ref(), opts(n_batch))?.eval_all(&ids)?
        };
        runs.push(logits);
    }
    println!("pos  cpu-pre/gpu-pre  cpu-pre/gpu-dec  gpu-pre/gpu-dec  cpu-pre/cpu-dec  argmax equal");
    let am = |v: &[f32]| v.iter().enumerate().fold((0, f32::MIN), |b, (i, &x)| if x > b.1 { (i, x) } else { b }).0;
    let mut worst = [0f64; 4];
    #[allow(clippy::needless_range_loop)] // four runs indexed by position side by side
    for p in 0..ids.len() {
        let e = [
            nmse(&runs[0][p], &runs[2][p]),
            nmse(&runs[0][p], &runs[3][p]),
            nmse(&runs[2][p], &runs[3][p]),
            nmse(&runs[0][p], &runs[1][p]),
        ];
        for (w, x) in worst.iter_mut().zip(e) {
            *w = w.max(x);
        }
        let same = (am(&runs[0][p]) == am(&runs[2][p])) as u8 + (am(&runs[0][p]) == am(&runs[3][p])) as u8;
        println!("{p:3}  {:.2e}  {:.2e}  {:.2e}  {:.2e}  {same}/2", e[0], e[1], e[2], e[3]);
    }
    println!("worst {:.2e}  {:.2e}  {:.2e}  {:.2e}", worst[0], worst[1], worst[2], worst[3]);
    Ok(())
}
