//! Host-side timers of the ops the metrics name: MoE routing, Mamba2 conv and scan.
//! Each layer that runs one owns an [`OpTimer`]; a model sums them into [`OpTimes`], which
//! the engine exports with its metrics. The time is the wall time of the backend call on the
//! host: exact on the CPU backend; on a device backend it is the launch (conv, scan) or the
//! wait for the router logits (routing, which downloads them), not the kernel time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Calls and nanoseconds of one op in one layer.
#[derive(Debug, Default)]
pub struct OpTimer {
    calls: AtomicU64,
    nanos: AtomicU64,
}

impl OpTimer {
    /// Run `f`, adding its wall time.
    pub fn time<T>(&self, f: impl FnOnce() -> T) -> T {
        let t0 = Instant::now();
        let r = f();
        self.nanos.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.calls.fetch_add(1, Ordering::Relaxed);
        r
    }

    pub fn get(&self) -> OpTime {
        OpTime { calls: self.calls.load(Ordering::Relaxed), time: Duration::from_nanos(self.nanos.load(Ordering::Relaxed)) }
    }
}

/// Calls and total time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpTime {
    pub calls: u64,
    pub time: Duration,
}

impl std::ops::AddAssign for OpTime {
    fn add_assign(&mut self, o: OpTime) {
        self.calls += o.calls;
        self.time += o.time;
    }
}

/// A model's totals since load.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpTimes {
    pub moe_routing: OpTime,
    pub ssm_conv: OpTime,
    pub ssm_scan: OpTime,
}

impl std::ops::AddAssign for OpTimes {
    fn add_assign(&mut self, o: OpTimes) {
        self.moe_routing += o.moe_routing;
        self.ssm_conv += o.ssm_conv;
        self.ssm_scan += o.ssm_scan;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timers_add_up() {
        let t = OpTimer::default();
        assert_eq!(t.time(|| 7), 7);
        t.time(|| std::thread::sleep(Duration::from_millis(2)));
        let g = t.get();
        assert_eq!(g.calls, 2);
        assert!(g.time >= Duration::from_millis(2));
        let mut a = OpTimes { ssm_scan: g, ..Default::default() };
        a += OpTimes { moe_routing: g, ssm_scan: g, ..Default::default() };
        assert_eq!((a.ssm_scan.calls, a.moe_routing.calls, a.ssm_conv.calls), (4, 2, 0));
    }
}
