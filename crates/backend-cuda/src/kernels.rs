//! The kernel registry: every kernel the compiled units export, and whether it waits for its
//! predecessor (`GDC()`, so it may be launched with programmatic dependent launch). The runtime
//! looks these up once at start-up; `tests/gdc.rs` holds the waiting list to the kernel sources.

use crate::runtime::Kernel;

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
