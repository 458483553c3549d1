//! `write_quantized`: the output file, tensor by tensor in chunks of rows. Each chunk's rows
//! are dequantized to f32 and quantized to the planned type in parallel (rayon's current
//! pool); a tensor that keeps its type is copied. At most [`CHUNK_BYTES`] of output are held
//! at a time, whatever the model's size.

use super::plan::{QuantizePlan, TensorPlan};
use super::QuantizeError;
use quarrel_gguf::{Gguf, GgufWriter};
use rayon::prelude::*;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Upper bound on the output bytes converted (and buffered) per step.
pub const CHUNK_BYTES: usize = 32 << 20;

/// Where the conversion is, after each chunk.
pub struct Progress<'a> {
    /// 0-based index of the tensor in the plan.
    pub index: usize,
    pub tensor: &'a TensorPlan,
    /// Output bytes of this tensor written so far.
    pub tensor_done: u64,
    /// Output tensor bytes written so far, of `plan.out_bytes`.
    pub done: u64,
}

/// What was written.
#[derive(Clone, Debug)]
pub struct QuantizeSummary {
    /// Bytes of the input file(s) and of the output file.
    pub in_size: u64,
    pub out_size: u64,
    /// Tensors converted and tensors copied as they were.
    pub n_converted: usize,
    pub n_copied: usize,
    pub seconds: f64,
}

/// An error unless `input` and `output` name different files.
pub fn check_distinct(input: &Path, output: &Path) -> Result<(), QuantizeError> {
    let same = match (input.canonicalize(), output.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        // the output does not exist yet: compare its folder and name
        (Ok(a), Err(_)) => match (output.parent(), output.file_name()) {
            (Some(dir), Some(name)) => {
                let dir = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
                dir.canonicalize().is_ok_and(|d| d.join(name) == a)
            }
            _ => false,
        },
        _ => false,
    };
    if same {
        return Err(QuantizeError::SameFile(input.to_path_buf()));
    }
    Ok(())
}

fn partial_path(out: &Path) -> PathBuf {
    let mut s = out.as_os_str().to_owned();
    s.push(".partial");
    PathBuf::from(s)
}

/// Write the model `g` as `plan` says to `out`. The file appears under its name only when
/// complete (it is written as `out.partial` first).
pub fn write_quantized(
    g: &Gguf,
    plan: &QuantizePlan,
    out: &Path,
    progress: &mut dyn FnMut(&Progress),
) -> Result<QuantizeSummary, QuantizeError> {
    let start = Instant::now();
    let mut w = GgufWriter::new();
    for (k, v) in &plan.metadata {
        w.set(k, v.clone());
    }
    for t in &plan.tensors {
        w.add_tensor(&t.info.name, &t.info.dims, t.to)?;
    }
    let tmp = partial_path(out);
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| QuantizeError::Io { path, source }
    };
    let file = File::create(&tmp).map_err(io(&tmp))?;
    let result = (|| -> Result<u64, QuantizeError> {
        let mut sink = w.write_header(BufWriter::with_capacity(4 << 20, file))?;
        let mut buf: Vec<u8> = Vec::new();
        let mut done = 0u64;
        for (index, t) in plan.tensors.iter().enumerate() {
            let src = g.tensor_bytes(&t.info);
            let mut tensor_done = 0u64;
            let mut emit = |sink: &mut quarrel_gguf::TensorSink<_>, bytes: &[u8]| -> Result<(), QuantizeError> {
                sink.write_chunk(bytes)?;
                tensor_done += bytes.len() as u64;
                done += bytes.len() as u64;
                progress(&Progress { index, tensor: t, tensor_done, done });
                Ok(())
            };
            if !t.converts() {
                for chunk in src.chunks(CHUNK_BYTES) {
                    emit(&mut sink, chunk)?;
                }
                if src.is_empty() {
                    emit(&mut sink, src)?;
                }
                continue;
            }
            let (ne0, n_rows) = t.rows();
            let row_in = src.len() / n_rows.max(1);
            let row_out = (t.out_bytes as usize) / n_rows.max(1);
            let rows_per_chunk = (CHUNK_BYTES / row_out.max(1)).max(1);
            for r0 in (0..n_rows).step_by(rows_per_chunk) {
                let n = rows_per_chunk.min(n_rows - r0);
                buf.resize(n * row_out, 0);
                convert_rows(t, ne0, &src[r0 * row_in..(r0 + n) * row_in], row_in, &mut buf, row_out)?;
                emit(&mut sink, &buf)?;
            }
        }
        let mut f = sink.finish()?;
        f.flush().map_err(io(&tmp))?;
        let file = f.into_inner().map_err(|e| QuantizeError::Io { path: tmp.clone(), source: e.into_error() })?;
        file.sync_all().map_err(io(&tmp))?;
        Ok(file.metadata().map_err(io(&tmp))?.len())
    })();
    let out_size = match result {
        Ok(n) => n,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    std::fs::rename(&tmp, out).map_err(io(out))?;
    let n_converted = plan.tensors.iter().filter(|t| t.converts()).count();
    Ok(QuantizeSummary {
        in_size: g.file_size() as u64,
        out_size,
        n_converted,
        n_copied: plan.tensors.len() - n_converted,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// Rows of `t` from its input type to its output type, in parallel.
fn convert_rows(t: &TensorPlan, ne0: usize, src: &[u8], row_in: usize, dst: &mut [u8], row_out: usize) -> Result<(), QuantizeError> {
    let (from, to) = (t.info.ty, t.to);
    let err = |source| QuantizeError::Quant { tensor: t.info.name.clone(), source };
    dst.par_chunks_mut(row_out).zip(src.par_chunks(row_in)).with_min_len((16384 / ne0).max(1)).try_for_each_init(
        || vec![0f32; ne0],
        |row, (out, inp)| {
            quarrel_quant::dequantize(from, inp, row).map_err(err)?;
            quarrel_quant::quantize(to, row, out).map_err(err)
        },
    )
}
