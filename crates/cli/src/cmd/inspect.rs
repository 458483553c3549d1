//! `quarrel inspect`: metadata and the tensor table of a GGUF file.

use crate::resolve::resolve_model;
use anyhow::{Context, Result};
use quarrel_gguf::Gguf;

/// Show a GGUF file's metadata (long arrays abbreviated) and its tensors.
#[derive(clap::Args)]
pub struct Args {
    /// A .gguf path or model name.
    pub model: String,
    /// Print full arrays and strings.
    #[arg(long)]
    pub full: bool,
}

pub fn main(a: Args) -> Result<()> {
    let path = resolve_model(Some(&a.model), false)?;
    let g = Gguf::open(&path).with_context(|| format!("opening {}", path.display()))?;
    println!(
        "{}: GGUF v{}, {} metadata keys, {} tensors, alignment {}",
        path.display(),
        g.version,
        g.metadata().len(),
        g.tensors().len(),
        g.alignment
    );
    println!("\n{:<48} {:<14} value", "key", "type");
    for (k, v) in g.metadata() {
        let shown = if a.full { format!("{v:?}") } else { v.to_string() };
        println!("{k:<48} {:<14} {shown}", v.type_name());
    }
    println!("\n{:<40} {:<8} {:<24} {:>12}", "tensor", "type", "shape", "bytes");
    let mut total = 0u64;
    for t in g.tensors() {
        let shape = format!("{:?}", t.dims);
        println!("{:<40} {:<8} {:<24} {:>12}", t.name, t.ty.name(), shape, t.n_bytes);
        total += t.n_bytes;
    }
    let params: u64 = g.tensors().iter().map(|t| t.n_elements()).sum();
    println!(
        "\n{} parameters, {:.1} MiB of tensor data, {:.2} bits per weight",
        params,
        total as f64 / (1 << 20) as f64,
        total as f64 * 8.0 / params.max(1) as f64
    );
    Ok(())
}
