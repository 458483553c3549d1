//! The kernel sources, their compile units, and the kernel registry: every kernel the units
//! export and whether it waits for its predecessor (`GDC()`, so it may be launched with
//! programmatic dependent launch). build.rs derives the registry (`KERNELS`) from the sources;
//! the runtime looks every kernel up once at start-up.

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
    Unit {
        name: "attn_f16_2",
        files: &["norm_row.cuh", "ops.cu", "attention.cu"],
        defines: "#define ATTN_KV KV_F16\n#define ATTN_DPL 2\n",
    },
    Unit {
        name: "attn_f16_4",
        files: &["norm_row.cuh", "ops.cu", "attention.cu"],
        defines: "#define ATTN_KV KV_F16\n#define ATTN_DPL 4\n",
    },
    Unit {
        name: "attn_f16_8",
        files: &["norm_row.cuh", "ops.cu", "attention.cu"],
        defines: "#define ATTN_KV KV_F16\n#define ATTN_DPL 8\n",
    },
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

// `KERNELS`: (source file, kernel, waits), written by build.rs from kernels/*.cu and *.cuh.
include!(concat!(env!("OUT_DIR"), "/kernel_registry.rs"));

/// Every kernel, looked up once when the device starts.
pub(crate) fn all() -> Vec<Kernel> {
    KERNELS.iter().map(|&(_, name, waits)| Kernel { name: name.to_string(), waits }).collect()
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

    /// Every source the registry found a kernel in is compiled (in `FILES` and so in a unit, by
    /// the test above): a kernel of a file outside them would fail the device's start.
    #[test]
    fn every_registered_kernel_is_in_a_compiled_file() {
        assert!(KERNELS.len() > 100, "only {} kernels registered", KERNELS.len());
        for (file, name, _) in KERNELS {
            assert!(PROGRAM.files.iter().any(|(f, _)| f == file), "{name}: {file} is not in FILES");
        }
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
