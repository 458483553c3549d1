//! The backend's settings: numerics (`set_numerics`), the expert budget, and the switches the
//! crate's own tests use to compare two real paths (cargo feature `test-switches`).

use crate::matmul::cpu_order::OrderedGemv;
use crate::CudaBackend;
#[cfg(feature = "test-switches")]
use crate::{ssm::ScanKernel, CudaKv};
use quarrel_core::Numerics;
#[cfg(feature = "test-switches")]
use quarrel_core::Result;
use std::sync::atomic::Ordering;

impl CudaBackend {
    /// The float orders of the backend's ops from now on:
    ///
    /// - `Fast` (the default): the fastest kernels; a prompt and its tokens one by one can
    ///   differ by roundings.
    /// - `Invariant`: batch-invariant at prefill speed: every quantized matmul in MMQ's float
    ///   order (prompts through MMQ, never split over K nor the f16 GEMM; decode steps through
    ///   the GEMV in MMQ's order, `matmul::mmq_order`), float matmuls through the float GEMV,
    ///   MoE routing on the device at every token count, and attention in one order per query
    ///   position (f16 caches: the one pass of exact attention below position 128, the
    ///   tensor-core kernel over absolute position spans from there; other caches the one
    ///   pass). A prompt, its tokens one by one and any batch give the same logits bit for bit.
    ///   Experts kept in host memory (`set_expert_budget`) still multiply in the fast order.
    /// - `Exact`: the CPU backend's (llama.cpp's CPU build's) numerics where the GPU can
    ///   reproduce them bit for bit: attention over f16 caches by ggml's vector path at every
    ///   length (one pass, no split-K, no grouped decode kernel), Q4_0 / Q4_1 / Q8_0 matmuls in
    ///   the CPU's float order at every token count (`matmul::cpu_order`), every other matmul
    ///   through the decode GEMV at every token count, MoE routing by the device router at
    ///   every token count. Element-wise ops, RMSNorm, embeddings and the activation
    ///   quantization have the CPU's bits in every mode.
    pub fn set_numerics(&self, n: Numerics) {
        self.numerics.store(n as u8, Ordering::Relaxed);
    }

    /// The numerics in effect.
    pub fn numerics(&self) -> Numerics {
        match self.numerics.load(Ordering::Relaxed) {
            x if x == Numerics::Invariant as u8 => Numerics::Invariant,
            x if x == Numerics::Exact as u8 => Numerics::Exact,
            _ => Numerics::Fast,
        }
    }

    /// Attention over f16 caches with ggml's CPU vector-path numerics (f16 q and V
    /// accumulator, one pass over the positions) at every length: exact and invariant numerics.
    pub(crate) fn exact_attn(&self) -> bool {
        self.numerics() != Numerics::Fast
    }

    /// Matmuls in the CPU's float order / through the decode GEMV at every token count.
    pub(crate) fn exact_mm(&self) -> bool {
        self.numerics() == Numerics::Exact
    }

    /// Matmuls in MMQ's float order at every token count.
    pub(crate) fn invariant_mm(&self) -> bool {
        self.numerics() == Numerics::Invariant
    }

    /// Whether matmuls of up to `cpu_order::ORDERED_MAX_TOKENS` tokens take the ordered GEMV now.
    pub(crate) fn ordered_gemv(&self) -> bool {
        let loaded = self.loaded_bytes.load(Ordering::Relaxed);
        OrderedGemv::from_u8(self.ordered_gemv.load(Ordering::Relaxed)).applies(loaded)
    }

    /// Device memory for the expert tensors of models loaded from now on (`--expert-budget`):
    /// the experts beyond it stay in pinned host memory and the most recently routed are
    /// cached on the device (see `experts`). `None`: no limit (experts that do not fit in
    /// device memory are offloaded all the same, instead of failing the load).
    pub fn set_expert_budget(&self, bytes: Option<usize>) {
        self.experts.set(bytes);
    }

    /// What the expert cache did so far (hits, uploads).
    pub fn expert_stats(&self) -> crate::weights::experts::ExpertStats {
        self.experts.stats()
    }

    /// Contexts (positions, the batch's largest) up to which decode and short-prompt attention
    /// over an f16 cache takes `attn_vec2_f16` (the CPU's numerics, one pass); longer ones take
    /// the f32 split-K kernels. Default `attention::VEC_MAX_POSITIONS`; 0: split-K (and the
    /// grouped batch-decode kernel) always.
    /// Decode batches of several sequences through the grouped-query kernel (`true`, the
    /// default where it applies) or the per-head kernel.
    #[cfg(feature = "test-switches")]
    pub fn set_gqa_decode(&self, on: bool) {
        self.gqa_decode.store(on, Ordering::Relaxed);
    }

    #[cfg(feature = "test-switches")]
    pub fn set_attn_vec_max(&self, positions: usize) {
        self.attn_vec_max.store(positions, std::sync::atomic::Ordering::Relaxed);
    }

    /// Prefill batches (query tokens) from which attention over an f16 cache takes the
    /// tensor-core kernel (kernels/attn_mma.cu; f16 q and probabilities); `None`: the f32 tiled
    /// kernel always. Default `attention::MMA_MIN_TOKENS`. Exact attention never takes it.
    #[cfg(feature = "test-switches")]
    pub fn set_attn_mma_min(&self, tokens: Option<usize>) {
        self.attn_mma_min.store(tokens.unwrap_or(usize::MAX), std::sync::atomic::Ordering::Relaxed);
    }

    /// Decode and short prompts (up to `cpu_order::ORDERED_MAX_TOKENS` tokens) over Q4_0 / Q4_1 /
    /// Q8_0 weights: `true` multiplies in the CPU backend's float order (the CPU's bits, through
    /// `gemvo_*`), `false` with the fast GEMV's order. The default (`OrderedGemv::Auto`) is the
    /// CPU's order for models of at most `cpu_order::ORDERED_AUTO_MAX_BYTES` of weights, whose
    /// decode steps are bound by launches, not by bandwidth.
    #[cfg(feature = "test-switches")]
    pub fn set_ordered_gemv(&self, on: bool) {
        let mode = if on { OrderedGemv::On } else { OrderedGemv::Off };
        self.ordered_gemv.store(mode as u8, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether decode steps over `kv`'s recurrent state run the Mamba2 conv and scan as one
    /// launch (`ssm_conv_scan`, the default) or two (tests: the fused kernel against its twin).
    #[cfg(feature = "test-switches")]
    pub fn set_ssm_merge(&self, kv: &CudaKv, on: bool) -> Result<()> {
        crate::state(kv)?.merge.store(on, Ordering::Relaxed);
        Ok(())
    }

    /// Whether a decode step's MoE combine joins the residual add and RMSNorm after it
    /// (`comb_add_rms_norm`, the default; tests compare both ways bit for bit).
    #[cfg(feature = "test-switches")]
    pub fn set_comb_norm_fusion(&self, on: bool) {
        self.router.comb_norm.store(on, Ordering::Relaxed);
    }

    /// The kernel of prefill scans (tests compare them bit for bit; default the specialized
    /// kernel where the state size has one).
    #[cfg(feature = "test-switches")]
    pub fn set_scan_kernel(&self, k: ScanKernel) {
        self.scan_kernel.store(k as u8, Ordering::Relaxed);
    }
}
