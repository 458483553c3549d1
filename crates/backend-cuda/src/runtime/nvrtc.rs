//! Kernel compilation. The embedded `.cu` sources are compiled in units: each unit is one NVRTC
//! program built straight to a CUBIN for the device's exact architecture (so the driver has
//! nothing to JIT when it loads), all missing units at once on their own threads, each cached on
//! disk keyed by the hash of its source and the architecture. The first use on a fresh machine
//! costs the slowest unit's compile instead of the sum of all (one program took ~2 minutes).
//! Where the driver refuses a CUBIN (an NVRTC newer than the driver), the unit is compiled to
//! PTX for the virtual architecture and the driver JIT-compiles that instead.

use crate::error::CudaError;
use cudarc::nvrtc::{result, sys, Ptx};
use std::ffi::{c_char, CString};
use std::path::{Path, PathBuf};

/// Kernel sources, embedded in the binary. `common.cuh` opens every unit.
pub(crate) const FILES: &[(&str, &str)] = &[
    ("common.cuh", include_str!("../../kernels/common.cuh")),
    ("norm_row.cuh", include_str!("../../kernels/norm_row.cuh")),
    ("ops.cu", include_str!("../../kernels/ops.cu")),
    ("sample.cu", include_str!("../../kernels/sample.cu")),
    ("matmul.cu", include_str!("../../kernels/matmul.cu")),
    ("attention.cu", include_str!("../../kernels/attention.cu")),
    ("attn_batch.cu", include_str!("../../kernels/attn_batch.cu")),
    ("attn_vec.cu", include_str!("../../kernels/attn_vec.cu")),
    ("attn_mma.cu", include_str!("../../kernels/attn_mma.cu")),
    ("mmq.cu", include_str!("../../kernels/mmq.cu")),
    ("moe.cu", include_str!("../../kernels/moe.cu")),
    ("ssm.cu", include_str!("../../kernels/ssm.cu")),
    ("exact.cu", include_str!("../../kernels/exact.cu")),
    ("gemvm.cu", include_str!("../../kernels/gemvm.cu")),
    ("gelu.cu", include_str!("../../kernels/gelu.cu")),
];

/// One NVRTC program: its files in order (a file that uses another's macros or templates names
/// it first; a kernel compiled into several units is looked up in the first that has it) and
/// defines put before them (e.g. one KV type of the attention kernels per unit).
pub(crate) struct Unit {
    pub name: &'static str,
    pub files: &'static [&'static str],
    pub defines: &'static str,
}

/// The units (`scripts/cuda-kernel-check.py` reads this table: keep one unit per line). The f16
/// attention kernels (with ggml's exact vector path) take longest: one unit per DPL.
pub(crate) const UNITS: &[Unit] = &[
    Unit { name: "ops", files: &["norm_row.cuh", "ops.cu", "sample.cu", "gelu.cu"], defines: "" },
    Unit { name: "attn_f32", files: &["norm_row.cuh", "ops.cu", "attention.cu"], defines: "#define ATTN_KV KV_F32\n" },
    Unit { name: "attn_f16_2", files: &["norm_row.cuh", "ops.cu", "attention.cu"], defines: "#define ATTN_KV KV_F16\n#define ATTN_DPL 2\n" },
    Unit { name: "attn_f16_4", files: &["norm_row.cuh", "ops.cu", "attention.cu"], defines: "#define ATTN_KV KV_F16\n#define ATTN_DPL 4\n" },
    Unit { name: "attn_f16_8", files: &["norm_row.cuh", "ops.cu", "attention.cu"], defines: "#define ATTN_KV KV_F16\n#define ATTN_DPL 8\n" },
    Unit { name: "attn_q8_0", files: &["norm_row.cuh", "ops.cu", "attention.cu"], defines: "#define ATTN_KV KV_Q8_0\n" },
    Unit { name: "attn_q4_0", files: &["norm_row.cuh", "ops.cu", "attention.cu"], defines: "#define ATTN_KV KV_Q4_0\n" },
    Unit { name: "attn_batch", files: &["norm_row.cuh", "ops.cu", "attn_batch.cu"], defines: "" },
    Unit { name: "attn_vec", files: &["attn_vec.cu"], defines: "" },
    Unit { name: "attn_mma", files: &["attn_mma.cu"], defines: "" },
    Unit { name: "matmul", files: &["matmul.cu", "moe.cu"], defines: "" },
    Unit { name: "mmq_id", files: &["mmq.cu"], defines: "#define MMQ_ID_UNIT\n" },
    Unit { name: "ssm", files: &["ssm.cu"], defines: "" },
    Unit { name: "exact", files: &["exact.cu"], defines: "" },
    Unit { name: "gemvm", files: &["mmq.cu", "gemvm.cu"], defines: "#define GEMVM_UNIT\n" },
];

fn file(name: &str) -> &'static str {
    FILES.iter().find(|(n, _)| *n == name).map(|(_, s)| *s).unwrap_or_else(|| panic!("kernel file {name} missing from FILES"))
}

/// A unit's whole source: its defines, then `common.cuh` and its files.
pub(crate) fn unit_source(u: &Unit) -> String {
    let mut s = String::new();
    s.push_str(u.defines);
    for name in std::iter::once("common.cuh").chain(u.files.iter().copied()) {
        s.push_str(&format!("// ---- {name}\n{}\n", file(name)));
    }
    s
}

/// FNV-1a, stable across builds (the cache key).
fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf29ce484222325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100000001b3))
}

/// What NVRTC produces for a unit: a CUBIN for `sm_XY` or PTX for `compute_XY`.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Target {
    Cubin,
    Ptx,
}

fn cache_file(dir: &Path, u: &Unit, cc: (i32, i32), t: Target) -> PathBuf {
    let (arch, ext) = match t {
        Target::Cubin => (format!("sm_{}{}", cc.0, cc.1), "cubin"),
        Target::Ptx => (format!("compute_{}{}", cc.0, cc.1), "ptx"),
    };
    dir.join(format!("{}-{:016x}-{arch}.{ext}", u.name, fnv(&unit_source(u))))
}

fn as_ptx(t: Target, bytes: Vec<u8>) -> Ptx {
    match t {
        Target::Cubin => Ptx::from_binary(bytes),
        Target::Ptx => Ptx::from_src(String::from_utf8_lossy(&bytes).into_owned()),
    }
}

/// One NVRTC program to CUBIN or PTX bytes; the compiler's log on failure.
fn nvrtc(src: &str, name: &str, arch: &str, t: Target) -> Result<Vec<u8>, String> {
    let c_src = CString::new(src).map_err(|e| e.to_string())?;
    let c_name = CString::new(format!("{name}.cu")).map_err(|e| e.to_string())?;
    let prog = result::create_program(&c_src, Some(&c_name)).map_err(|e| format!("{e:?}"))?;
    let opts = [format!("--gpu-architecture={arch}"), "--std=c++17".to_string()];
    // SAFETY: prog is a live program until destroy_program below; buffers are sized by NVRTC.
    let out = unsafe {
        match result::compile_program(prog, &opts) {
            Err(e) => {
                let log = result::get_program_log(prog).map(|l| l.iter().map(|&c| c as u8 as char).collect::<String>()).unwrap_or_default();
                Err(format!("{e:?}\n{}", log.trim_end_matches('\0')))
            }
            Ok(()) => {
                let mut n = 0usize;
                let size = if t == Target::Cubin { sys::nvrtcGetCUBINSize(prog, &mut n) } else { sys::nvrtcGetPTXSize(prog, &mut n) };
                size.result().map_err(|e| format!("{e:?}")).and_then(|_| {
                    let mut buf = vec![0u8; n];
                    let p = buf.as_mut_ptr() as *mut c_char;
                    let r = if t == Target::Cubin { sys::nvrtcGetCUBIN(prog, p) } else { sys::nvrtcGetPTX(prog, p) };
                    r.result().map(|_| buf).map_err(|e| format!("{e:?}"))
                })
            }
        }
    };
    // SAFETY: created above, destroyed once.
    let _ = unsafe { result::destroy_program(prog) };
    out
}

/// A unit's compiled code for `cc`, from the disk cache in `dir` or compiled now (and cached).
pub(crate) fn compile_unit(dir: &Path, u: &Unit, cc: (i32, i32), t: Target) -> Result<Ptx, CudaError> {
    let path = cache_file(dir, u, cc, t);
    if let Ok(bytes) = std::fs::read(&path) {
        return Ok(as_ptx(t, bytes));
    }
    let arch = match t {
        Target::Cubin => format!("sm_{}{}", cc.0, cc.1),
        Target::Ptx => format!("compute_{}{}", cc.0, cc.1),
    };
    let mut bytes = nvrtc(&unit_source(u), u.name, &arch, t).map_err(|log| CudaError::Compile(format!("kernel unit {}: {log}", u.name)))?;
    if t == Target::Ptx {
        // PTX is a C string for the driver
        while bytes.last() == Some(&0) {
            bytes.pop();
        }
    }
    if std::fs::create_dir_all(dir).is_ok() {
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, &bytes).is_ok() {
            let _ = std::fs::rename(&tmp, &path);
        }
    }
    Ok(as_ptx(t, bytes))
}

/// Every unit's CUBIN for `cc`: cached ones read, the others compiled in parallel, with a
/// spinner (or one line when stderr is no terminal) while NVRTC works.
pub(crate) fn compile_all(dir: &Path, cc: (i32, i32)) -> Result<Vec<Ptx>, CudaError> {
    let missing = UNITS.iter().filter(|u| !cache_file(dir, u, cc, Target::Cubin).exists()).count();
    if missing > 0 {
        // SAFETY: only probes for the shared library.
        if !unsafe { sys::is_culib_present() } {
            return Err(CudaError::NoDevice("NVRTC (libnvrtc.so) not found: install the CUDA toolkit's runtime compiler or add it to LD_LIBRARY_PATH".into()));
        }
    }
    let msg = format!("compiling {missing} CUDA kernel units for sm_{}{} in parallel (first use; cached in {})", cc.0, cc.1, dir.display());
    let bar = indicatif::ProgressBar::new_spinner().with_message(msg.clone());
    if missing > 0 {
        if bar.is_hidden() {
            eprintln!("{msg} ...");
        }
        bar.enable_steady_tick(std::time::Duration::from_millis(200));
    }
    let t0 = std::time::Instant::now();
    let out: Vec<Result<Ptx, CudaError>> = std::thread::scope(|s| {
        let hs: Vec<_> = UNITS.iter().map(|u| s.spawn(move || compile_unit(dir, u, cc, Target::Cubin))).collect();
        hs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(CudaError::Compile("an NVRTC thread panicked".into())))).collect()
    });
    bar.finish_and_clear();
    if missing > 0 {
        eprintln!("compiled {missing} CUDA kernel units for sm_{}{} in {:.0} s", cc.0, cc.1, t0.elapsed().as_secs_f64());
    }
    out.into_iter().collect()
}

/// The value of `#define <name> <integer>` in a kernel source (tests that hold the host's
/// mirrors of kernel constants to the kernel).
#[cfg(test)]
pub(crate) fn kernel_define(src: &str, name: &str) -> usize {
    let line = src.lines().find(|l| l.starts_with(&format!("#define {name} "))).unwrap_or_else(|| panic!("{name} not defined"));
    line.split_whitespace().nth(2).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{name}: {line}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_file_is_in_a_unit_and_units_are_unique() {
        for (name, _) in FILES.iter().skip(1) {
            assert!(UNITS.iter().any(|u| u.files.contains(name)), "{name} is in no unit");
        }
        for (i, u) in UNITS.iter().enumerate() {
            assert!(UNITS[i + 1..].iter().all(|v| v.name != u.name), "unit {} twice", u.name);
            assert!(u.files.iter().all(|f| FILES.iter().any(|(n, _)| n == f)), "unit {} names a missing file", u.name);
        }
        // the KV type of each attention unit is a define, so each unit's source (and cache key) differs
        let keys: std::collections::HashSet<u64> = UNITS.iter().map(|u| fnv(&unit_source(u))).collect();
        assert_eq!(keys.len(), UNITS.len());
    }

    /// Where NVRTC is installed (not in CI): every unit compiles to a CUBIN for sm_90, in
    /// parallel, into a fresh cache, and a second call reads them all back from it.
    #[test]
    fn units_compile_to_cubins_where_nvrtc_exists() {
        // SAFETY: only probes for the shared library.
        if !unsafe { sys::is_culib_present() } {
            eprintln!("skipped: no libnvrtc");
            return;
        }
        let dir = std::env::temp_dir().join(format!("quarrel-nvrtc-test-{}", std::process::id()));
        let first = compile_all(&dir, (9, 0)).expect("units compile");
        assert_eq!(first.len(), UNITS.len());
        let cached = std::fs::read_dir(&dir).unwrap().count();
        assert_eq!(cached, UNITS.len());
        assert_eq!(compile_all(&dir, (9, 0)).expect("from the cache").len(), UNITS.len());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
