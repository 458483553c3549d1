//! [`ProfiledBackend`] wraps any backend and times every trait call by op kind (matmuls
//! by weight type and shape), for "where does a decode step go" tables. The timings are
//! exact for synchronous backends such as the CPU one.

use quarrel_core::{
    AttnParams, Backend, ForwardBatch, KvSpec, MoeRouting, QuantType, Result as CoreResult, RopeParams, Route, SsmParams, StateSpec,
    WeightSource,
};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What a [`ProfiledBackend`] groups its timings by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpKind {
    Embed,
    /// A matmul with a weight of this type and `(n_in, n_out)` shape.
    Matmul(QuantTypeKey, usize, usize),
    /// `matmul_many` over this many weights of this type sharing their input: `(n_in, the
    /// weights' n_out summed)`.
    MatmulMany(QuantTypeKey, usize, usize, usize),
    RmsNorm,
    Rope,
    Swiglu,
    Geglu,
    Add,
    Scale,
    GatherRows,
    KvStore,
    Attention,
    /// alloc, upload, download.
    Memory,
    /// MoE router (probabilities, top-k, weights).
    MoeRoute,
    /// Grouped expert matmul with a weight of this type and `(n_in, n_out * n_expert)` shape.
    MoeMatmul(QuantTypeKey, usize, usize),
    MoeCombine,
    ReluSqr,
    SsmConv,
    SsmScan,
    SsmNorm,
}

/// A `QuantType` that sorts (by its name).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QuantTypeKey(pub QuantType);

impl PartialOrd for QuantTypeKey {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

impl Ord for QuantTypeKey {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.name().cmp(o.0.name())
    }
}

impl std::fmt::Display for OpKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpKind::Embed => f.write_str("embed"),
            OpKind::Matmul(t, i, o) => write!(f, "matmul {} {i}x{o}", t.0.name()),
            OpKind::MatmulMany(t, i, o, n) => write!(f, "matmul x{n} {} {i}x{o}", t.0.name()),
            OpKind::RmsNorm => f.write_str("rms_norm"),
            OpKind::Rope => f.write_str("rope"),
            OpKind::Swiglu => f.write_str("swiglu"),
            OpKind::Geglu => f.write_str("geglu"),
            OpKind::Add => f.write_str("add"),
            OpKind::Scale => f.write_str("scale"),
            OpKind::GatherRows => f.write_str("gather_rows"),
            OpKind::KvStore => f.write_str("kv_store"),
            OpKind::Attention => f.write_str("attention"),
            OpKind::Memory => f.write_str("alloc/upload/download"),
            OpKind::MoeRoute => f.write_str("moe_route"),
            OpKind::MoeMatmul(t, i, o) => write!(f, "moe_matmul {} {i}x{o}", t.0.name()),
            OpKind::MoeCombine => f.write_str("moe_combine"),
            OpKind::ReluSqr => f.write_str("relu_sqr"),
            OpKind::SsmConv => f.write_str("ssm_conv"),
            OpKind::SsmScan => f.write_str("ssm_scan"),
            OpKind::SsmNorm => f.write_str("ssm_gated_norm"),
        }
    }
}

/// Calls and total time of one op kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpStat {
    pub calls: u64,
    pub time: Duration,
}

/// A backend that forwards every call to `inner` and times it by [`OpKind`].
pub struct ProfiledBackend<B: Backend> {
    pub inner: B,
    stats: Mutex<HashMap<OpKind, OpStat>>,
    /// The clock ops are timed with (None: wall time).
    clock: Option<fn() -> Duration>,
}

impl<B: Backend> ProfiledBackend<B> {
    pub fn new(inner: B) -> Self {
        ProfiledBackend { inner, stats: Mutex::new(HashMap::new()), clock: None }
    }

    /// Time ops with `clock` instead of wall time (e.g. the calling thread's CPU time, which
    /// a busy machine's scheduling does not inflate; single-threaded backends only then).
    pub fn with_clock(inner: B, clock: fn() -> Duration) -> Self {
        ProfiledBackend { inner, stats: Mutex::new(HashMap::new()), clock: Some(clock) }
    }

    /// Forget what was recorded so far.
    pub fn reset(&self) {
        self.stats.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// What was recorded, most time first.
    pub fn stats(&self) -> Vec<(OpKind, OpStat)> {
        let mut v: Vec<_> = self.stats.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|(k, s)| (*k, *s)).collect();
        v.sort_by(|a, b| b.1.time.cmp(&a.1.time).then(a.0.cmp(&b.0)));
        v
    }

    fn timed<T>(&self, kind: OpKind, f: impl FnOnce() -> T) -> T {
        if let Some(clock) = self.clock {
            let c0 = clock();
            let r = f();
            let dt = clock().saturating_sub(c0);
            let mut m = self.stats.lock().unwrap_or_else(|e| e.into_inner());
            let s = m.entry(kind).or_default();
            s.calls += 1;
            s.time += dt;
            return r;
        }
        let t0 = Instant::now();
        let r = f();
        let dt = t0.elapsed();
        let mut m = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        let s = m.entry(kind).or_default();
        s.calls += 1;
        s.time += dt;
        r
    }
}

impl<B: Backend> Backend for ProfiledBackend<B> {
    type Buf = B::Buf;
    type Weight = B::Weight;
    type Kv = B::Kv;

    fn name(&self) -> String {
        self.inner.name()
    }
    fn load_weight(&self, src: WeightSource<'_>) -> CoreResult<Self::Weight> {
        self.inner.load_weight(src)
    }
    fn weight_dims(&self, w: &Self::Weight) -> (usize, usize) {
        self.inner.weight_dims(w)
    }
    fn weight_type(&self, w: &Self::Weight) -> QuantType {
        self.inner.weight_type(w)
    }
    fn alloc(&self, n: usize) -> CoreResult<Self::Buf> {
        self.timed(OpKind::Memory, || self.inner.alloc(n))
    }
    fn upload(&self, src: &[f32]) -> CoreResult<Self::Buf> {
        self.timed(OpKind::Memory, || self.inner.upload(src))
    }
    fn download(&self, src: &Self::Buf) -> CoreResult<Vec<f32>> {
        self.timed(OpKind::Memory, || self.inner.download(src))
    }
    fn buf_len(&self, b: &Self::Buf) -> usize {
        self.inner.buf_len(b)
    }
    fn alloc_kv(&self, spec: &KvSpec) -> CoreResult<Self::Kv> {
        self.inner.alloc_kv(spec)
    }
    fn embed(&self, table: &Self::Weight, tokens: &[u32], out: &mut Self::Buf) -> CoreResult<()> {
        self.timed(OpKind::Embed, || self.inner.embed(table, tokens, out))
    }
    fn matmul(&self, w: &Self::Weight, x: &Self::Buf, n_tok: usize, out: &mut Self::Buf) -> CoreResult<()> {
        let (i, o) = self.inner.weight_dims(w);
        let kind = OpKind::Matmul(QuantTypeKey(self.inner.weight_type(w)), i, o);
        self.timed(kind, || self.inner.matmul(w, x, n_tok, out))
    }
    fn matmul_many(&self, ws: &[&Self::Weight], x: &Self::Buf, n_tok: usize, outs: &mut [&mut Self::Buf]) -> CoreResult<()> {
        let Some(w0) = ws.first() else { return self.inner.matmul_many(ws, x, n_tok, outs) };
        let n_in = self.inner.weight_dims(w0).0;
        let n_out = ws.iter().map(|w| self.inner.weight_dims(w).1).sum();
        let kind = OpKind::MatmulMany(QuantTypeKey(self.inner.weight_type(w0)), n_in, n_out, ws.len());
        self.timed(kind, || self.inner.matmul_many(ws, x, n_tok, outs))
    }
    fn rms_norm(&self, x: &Self::Buf, w: &Self::Weight, eps: f32, out: &mut Self::Buf) -> CoreResult<()> {
        self.timed(OpKind::RmsNorm, || self.inner.rms_norm(x, w, eps, out))
    }
    fn layer_norm(&self, x: &Self::Buf, w: &Self::Weight, b: &Self::Weight, eps: f32, out: &mut Self::Buf) -> CoreResult<()> {
        self.timed(OpKind::RmsNorm, || self.inner.layer_norm(x, w, b, eps, out))
    }
    fn rope(&self, x: &mut Self::Buf, positions: &[u32], n_head: usize, head_dim: usize, p: &RopeParams) -> CoreResult<()> {
        self.timed(OpKind::Rope, || self.inner.rope(x, positions, n_head, head_dim, p))
    }
    fn swiglu(&self, gate: &Self::Buf, up: &Self::Buf, out: &mut Self::Buf) -> CoreResult<()> {
        self.timed(OpKind::Swiglu, || self.inner.swiglu(gate, up, out))
    }
    fn geglu(&self, gate: &Self::Buf, up: &Self::Buf, out: &mut Self::Buf) -> CoreResult<()> {
        self.timed(OpKind::Geglu, || self.inner.geglu(gate, up, out))
    }
    fn add(&self, x: &mut Self::Buf, y: &Self::Buf) -> CoreResult<()> {
        self.timed(OpKind::Add, || self.inner.add(x, y))
    }
    fn add_bias(&self, x: &mut Self::Buf, b: &Self::Buf) -> CoreResult<()> {
        self.timed(OpKind::Add, || self.inner.add_bias(x, b))
    }
    fn scale(&self, x: &mut Self::Buf, s: f32) -> CoreResult<()> {
        self.timed(OpKind::Scale, || self.inner.scale(x, s))
    }
    fn gather_rows(&self, x: &Self::Buf, dim: usize, rows: &[usize], out: &mut Self::Buf) -> CoreResult<()> {
        self.timed(OpKind::GatherRows, || self.inner.gather_rows(x, dim, rows, out))
    }
    fn kv_store(&self, kv: &mut Self::Kv, layer: usize, k: &Self::Buf, v: &Self::Buf, batch: &ForwardBatch) -> CoreResult<()> {
        self.timed(OpKind::KvStore, || self.inner.kv_store(kv, layer, k, v, batch))
    }
    fn attention(
        &self,
        q: &Self::Buf,
        kv: &Self::Kv,
        layer: usize,
        batch: &ForwardBatch,
        p: &AttnParams,
        sinks: Option<&Self::Buf>,
        out: &mut Self::Buf,
    ) -> CoreResult<()> {
        self.timed(OpKind::Attention, || self.inner.attention(q, kv, layer, batch, p, sinks, out))
    }
    fn moe_route(&self, layer: usize, logits: &Self::Buf, bias: Option<&Self::Buf>, p: &MoeRouting) -> CoreResult<Vec<Route>> {
        self.timed(OpKind::MoeRoute, || self.inner.moe_route(layer, logits, bias, p))
    }
    fn moe_selections(&self) -> CoreResult<Vec<Vec<u64>>> {
        self.inner.moe_selections()
    }
    fn moe_matmul(
        &self,
        w: &Self::Weight,
        n_expert: usize,
        x: &Self::Buf,
        routes: &[Route],
        x_per_token: bool,
        out: &mut Self::Buf,
    ) -> CoreResult<()> {
        let (i, o) = self.inner.weight_dims(w);
        let kind = OpKind::MoeMatmul(QuantTypeKey(self.inner.weight_type(w)), i, o);
        self.timed(kind, || self.inner.moe_matmul(w, n_expert, x, routes, x_per_token, out))
    }
    fn moe_combine(&self, y: &Self::Buf, routes: &[Route], out: &mut Self::Buf) -> CoreResult<()> {
        self.timed(OpKind::MoeCombine, || self.inner.moe_combine(y, routes, out))
    }
    fn relu_sqr(&self, x: &mut Self::Buf) -> CoreResult<()> {
        self.timed(OpKind::ReluSqr, || self.inner.relu_sqr(x))
    }
    fn moe_add_bias(&self, y: &mut Self::Buf, bias: &Self::Buf, routes: &[Route]) -> CoreResult<()> {
        self.timed(OpKind::MoeCombine, || self.inner.moe_add_bias(y, bias, routes))
    }
    fn gelu(&self, x: &mut Self::Buf) -> CoreResult<()> {
        self.timed(OpKind::Geglu, || self.inner.gelu(x))
    }
    fn swiglu_oai(&self, gate: &Self::Buf, up: &Self::Buf, out: &mut Self::Buf, alpha: f32, limit: f32) -> CoreResult<()> {
        self.timed(OpKind::Swiglu, || self.inner.swiglu_oai(gate, up, out, alpha, limit))
    }
    fn alloc_state(&self, kv: &mut Self::Kv, spec: &StateSpec) -> CoreResult<()> {
        self.inner.alloc_state(kv, spec)
    }
    fn state_stats(&self, kv: &Self::Kv) -> CoreResult<(u64, u64)> {
        self.inner.state_stats(kv)
    }
    fn state_copy(&self, kv: &mut Self::Kv, src: usize, dst: usize) -> CoreResult<()> {
        self.timed(OpKind::Memory, || self.inner.state_copy(kv, src, dst))
    }
    fn ssm_conv(
        &self,
        kv: &mut Self::Kv,
        layer: usize,
        p: &SsmParams,
        zxbcdt: &Self::Buf,
        w: &Self::Buf,
        bias: Option<&Self::Buf>,
        batch: &ForwardBatch,
        out: &mut Self::Buf,
    ) -> CoreResult<()> {
        self.timed(OpKind::SsmConv, || self.inner.ssm_conv(kv, layer, p, zxbcdt, w, bias, batch, out))
    }
    fn ssm_scan(
        &self,
        kv: &mut Self::Kv,
        layer: usize,
        p: &SsmParams,
        xbc: &Self::Buf,
        zxbcdt: &Self::Buf,
        a: &Self::Buf,
        d: &Self::Buf,
        dt_bias: &Self::Buf,
        batch: &ForwardBatch,
        y: &mut Self::Buf,
    ) -> CoreResult<u64> {
        self.timed(OpKind::SsmScan, || self.inner.ssm_scan(kv, layer, p, xbc, zxbcdt, a, d, dt_bias, batch, y))
    }
    fn ssm_gated_norm(&self, p: &SsmParams, y: &Self::Buf, zxbcdt: &Self::Buf, w: &Self::Buf, out: &mut Self::Buf) -> CoreResult<()> {
        self.timed(OpKind::SsmNorm, || self.inner.ssm_gated_norm(p, y, zxbcdt, w, out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::tiny;
    use crate::Bench;
    use quarrel_cpu::CpuBackend;
    use quarrel_engine::{Engine, EngineOptions};

    #[test]
    fn profiled_backend_changes_nothing_and_counts_ops() {
        let dir = tempfile::tempdir().unwrap();
        let path = tiny(dir.path());
        let opts = EngineOptions { n_ctx: 32, ..Default::default() };
        let mut plain = Engine::load(CpuBackend::new(1).unwrap(), &path, opts.clone()).unwrap();
        let mut prof = Engine::load(ProfiledBackend::new(CpuBackend::new(1).unwrap()), &path, opts).unwrap();
        let ids: Vec<u32> = (0..12).map(|i| (i * 41 + 3) % 500).collect();
        assert_eq!(plain.eval_all(&ids).unwrap(), prof.eval_all(&ids).unwrap());
        prof.backend.reset();
        prof.bench_tg(4).unwrap();
        let stats = prof.backend.stats();
        let calls = |k: OpKind| stats.iter().find(|(x, _)| *x == k).map(|(_, s)| s.calls);
        assert_eq!(calls(OpKind::Embed), Some(4));
        let n_layer = prof.model.info().n_layer as u64;
        assert_eq!(calls(OpKind::Attention), Some(4 * n_layer));
        assert!(stats.iter().any(|(k, _)| matches!(k, OpKind::Matmul(..))));
        assert!(stats.windows(2).all(|w| w[0].1.time >= w[1].1.time), "sorted by time");
    }
}
