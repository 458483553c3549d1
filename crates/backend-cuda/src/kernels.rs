//! The kernel registry: every kernel the compiled units export, and whether it waits for its
//! predecessor (`GDC()`, so it may be launched with programmatic dependent launch). The runtime
//! looks these up once at start-up; `tests/gdc.rs` holds the waiting list to the kernel sources.

use crate::runtime::nvrtc::{Program, Unit};
use crate::runtime::Kernel;

/// Kernel sources, embedded in the binary. `common.cuh` opens every unit.
const FILES: &[(&str, &str)] = &[
    ("common.cuh", include_str!("../kernels/common.cuh")),
    ("norm_row.cuh", include_str!("../kernels/norm_row.cuh")),
    ("ops.cu", include_str!("../kernels/ops.cu")),
    ("sample.cu", include_str!("../kernels/sample.cu")),
    ("matmul.cu", include_str!("../kernels/matmul.cu")),
    ("attention.cu", include_str!("../kernels/attention.cu")),
    ("attn_batch.cu", include_str!("../kernels/attn_batch.cu")),
    ("attn_vec.cu", include_str!("../kernels/attn_vec.cu")),
    ("attn_mma.cu", include_str!("../kernels/attn_mma.cu")),
    ("mmq.cu", include_str!("../kernels/mmq.cu")),
    ("moe.cu", include_str!("../kernels/moe.cu")),
    ("ssm.cu", include_str!("../kernels/ssm.cu")),
    ("exact.cu", include_str!("../kernels/exact.cu")),
    ("gemvm.cu", include_str!("../kernels/gemvm.cu")),
    ("gelu.cu", include_str!("../kernels/gelu.cu")),
];

/// The units (`scripts/cuda-kernel-check.py` reads this table from this file: keep one unit per line). The f16
/// attention kernels (with ggml's exact vector path) take longest: one unit per DPL.
const UNITS: &[Unit] = &[
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
    Unit { name: "mmq", files: &["mmq.cu"], defines: "" },
    Unit { name: "mmq_id", files: &["mmq.cu"], defines: "#define MMQ_ID_UNIT\n" },
    Unit { name: "ssm", files: &["ssm.cu"], defines: "" },
    Unit { name: "exact", files: &["exact.cu"], defines: "" },
    Unit { name: "gemvm", files: &["mmq.cu", "gemvm.cu"], defines: "#define GEMVM_UNIT\n" },
];

/// The kernel sources the device compiles.
pub(crate) const PROGRAM: Program = Program { files: FILES, units: UNITS };

/// Every kernel's name and whether it waits for its predecessor (`tests/gdc.rs` holds them to
/// the kernel sources).
pub fn kernel_registry() -> Vec<(String, bool)> {
    all().into_iter().map(|k| (k.name, k.waits)).collect()
}

/// Every kernel, looked up once when the device starts.
pub(crate) fn all() -> Vec<Kernel> {
    let waiting = waiting_kernel_names().into_iter().map(|name| Kernel { name, waits: true });
    waiting.chain(plain_kernel_names().into_iter().map(|name| Kernel { name, waits: false })).collect()
}

/// The kernels that begin with `GDC()` (kernels/common.cuh: wait for the previous grid before
/// touching memory) and so may be launched with programmatic stream serialization. A kernel
/// launched so WITHOUT `GDC()` would race the kernel before it: list a new kernel here only
/// if its body starts with `GDC();`.
pub fn waiting_kernel_names() -> Vec<String> {
    let mut v: Vec<String> =
        ["quantize_q8", "zero_fill", "rms_norm", "add_rms_norm", "add_scaled_rms_norm", "comb_add_rms_norm", "comb_add_scaled_rms_norm", "argmax_rows", "sample_rows", "rope", "rope_kv_f32", "rope_kv_f16", "swiglu", "geglu", "add", "add_scaled", "scale", "gather_rows", "attn_combine", "attn_vec2_f16"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for q in ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_K", "q5_K", "q6_K"] {
        for nt in [1, 2, 4, 8] {
            v.push(format!("gemv_{q}_{nt}"));
            v.push(format!("gemv3_{q}_{nt}"));
            v.push(format!("gemv3r_{q}_{nt}"));
        }
        v.push(format!("dequant_{q}"));
        v.push(format!("embed_{q}"));
    }
    for f in ["f32", "f16", "bf16"] {
        for nt in [1, 2, 4, 8] {
            v.push(format!("gemv_{f}_{nt}"));
        }
        v.push(format!("embed_{f}"));
        v.push(format!("tof16_{f}"));
    }
    for k in ["f32", "f16", "q8_0", "q4_0"] {
        v.push(format!("kv_store_{k}"));
        for dpl in [2, 4, 8] {
            v.push(format!("attn_{k}_{dpl}"));
            v.push(format!("attn1_{k}_{dpl}"));
        }
    }
    // tensor-core prefill attention (attn_mma.cu)
    v.extend(crate::attention::mma_kernel_names());
    // MoE and Mamba2 decode kernels (moe.cu, ssm.cu)
    v.extend(crate::moe::gdc_kernel_names());
    v.extend(crate::moe::device_route::gdc_kernel_names());
    v.extend(crate::ssm::gdc_kernel_names());
    // the GEMVs in the CPU's float order
    v.extend(crate::matmul::cpu_order::kernel_names());
    // the GEMVs in MMQ's float order
    v.extend(crate::matmul::mmq_order::kernel_names());
    v
}

/// The kernels without `GDC()` (launched the plain way).
fn plain_kernel_names() -> Vec<String> {
    // MMQ, MoE and SSM kernels do not begin with GDC(): launched in plain stream order
    let mut v = Vec::new();
    v.extend(crate::matmul::mmq::kernel_names());
    v.extend(crate::batch::kernel_names());
    v.extend(crate::moe::kernel_names());
    v.extend(crate::moe::device_route::kernel_names());
    v.extend(crate::moe::chunked_gemv::kernel_names());
    v.extend(crate::ssm::kernel_names());
    v
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
    use crate::runtime::nvrtc::{compile_all, fnv};

    #[test]
    fn every_kernel_file_is_in_a_unit_and_units_are_unique() {
        for (name, _) in PROGRAM.files.iter().skip(1) {
            assert!(PROGRAM.units.iter().any(|u| u.files.contains(name)), "{name} is in no unit");
        }
        for (i, u) in PROGRAM.units.iter().enumerate() {
            assert!(PROGRAM.units[i + 1..].iter().all(|v| v.name != u.name), "unit {} twice", u.name);
            assert!(u.files.iter().all(|f| PROGRAM.files.iter().any(|(n, _)| n == f)), "unit {} names a missing file", u.name);
        }
        // the KV type of each attention unit is a define, so each unit's source (and cache key) differs
        let keys: std::collections::HashSet<u64> = PROGRAM.units.iter().map(|u| fnv(&PROGRAM.unit_source(u))).collect();
        assert_eq!(keys.len(), PROGRAM.units.len());
    }

    /// Where NVRTC is installed (not in CI): every unit compiles to a CUBIN for sm_90, in
    /// parallel, into a fresh cache, and a second call reads them all back from it.
    #[test]
    fn units_compile_to_cubins_where_nvrtc_exists() {
        // SAFETY: only probes for the shared library.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            eprintln!("skipped: no libnvrtc");
            return;
        }
        let dir = std::env::temp_dir().join(format!("quarrel-nvrtc-test-{}", std::process::id()));
        let first = compile_all(&dir, &PROGRAM, (9, 0)).expect("units compile");
        assert_eq!(first.len(), PROGRAM.units.len());
        let cached = std::fs::read_dir(&dir).unwrap().count();
        assert_eq!(cached, PROGRAM.units.len());
        assert_eq!(compile_all(&dir, &PROGRAM, (9, 0)).expect("from the cache").len(), PROGRAM.units.len());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
