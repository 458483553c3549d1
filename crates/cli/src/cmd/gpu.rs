//! `quarrel gpu`: the CUDA devices this build can use, and their device-to-device copy
//! bandwidth (the ceiling of a memory-bound decode step).

use anyhow::{Context, Result};
use quarrel_core::Backend;
use quarrel_cuda::CudaBackend;

/// List CUDA GPUs and measure each one's device-to-device copy bandwidth.
///
/// Bandwidth counts bytes read plus bytes written, as llama.cpp's and PyTorch's figures do;
/// a decode step that reads W bytes of weights cannot run faster than bandwidth / 2 / W
/// steps per second.
#[derive(clap::Args)]
pub struct Args {
    /// Bytes copied per repetition, in MiB.
    #[arg(long = "copy-mib", default_value_t = 1024)]
    pub copy_mib: usize,
    /// Repetitions of the copy.
    #[arg(short = 'r', long = "repetitions", default_value_t = 20)]
    pub reps: usize,
}

pub fn main(a: Args) -> Result<()> {
    let n = quarrel_cuda::device_count();
    if n == 0 {
        println!("no CUDA device (no driver library or no GPU): quarrel runs on the CPU");
        return Ok(());
    }
    for i in 0..n {
        let be = CudaBackend::new(i).with_context(|| format!("starting CUDA on GPU {i}"))?;
        let (free, total) = be.mem_info();
        let bw = be.copy_bandwidth(a.copy_mib << 20, a.reps.max(1))?;
        println!(
            "{}: {:.0} of {:.0} MiB free; device-to-device copy {:.1} GB/s (read + write)",
            be.name(),
            free as f64 / 1048576.0,
            total as f64 / 1048576.0,
            bw / 1e9
        );
    }
    for (name, value, meaning) in quarrel_cuda::tuning_table() {
        println!("{name}={value}  ({meaning})");
    }
    Ok(())
}
