//! Everything this crate reads from the environment, parsed once, in one place.
//!
//! | variable               | values                          | default        | meaning |
//! |------------------------|---------------------------------|----------------|---------|
//! | `QUARREL_SIMD`         | `scalar`, `avx2`, `avx512`, `avx512vnni` | the best the CPU has | cap on the kernels' instruction set |
//! | `QUARREL_HUGE_PAGES`   | `1` / `0`                       | `1`            | transparent huge pages for kept panels, repacked weights and K/V stores |
//! | `QUARREL_CPU_PROFILE`  | `1` / `0`                       | `0`            | count the thread pool's regions and task times (`CpuBackend::pool_stats`) |
//! | `QUARREL_CPU_ATTN`     | `invariant` / `llama`           | `invariant`    | attention over f16 caches: the f16 vector path for every sequence, or llama.cpp's per-batch choice |
//!
//! Switches: `1`, `on`, `true`, `yes` turn on; `0`, `off`, `false`, `no` or empty turn off;
//! anything else keeps the default. The tests' programmatic switches ([`set_repack`]) are
//! functions, not variables.

use crate::simd::Level;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::OnceLock;

/// The parsed environment.
#[derive(Clone, Debug)]
pub struct Tuning {
    /// `QUARREL_SIMD`: the highest SIMD level the kernels may use (None: no cap).
    pub simd_cap: Option<Level>,
    /// `QUARREL_HUGE_PAGES`: ask for transparent huge pages (Linux).
    pub huge_pages: bool,
    /// `QUARREL_CPU_PROFILE`: thread-pool profile counters.
    pub profile: bool,
    /// `QUARREL_CPU_ATTN`: `false` selects llama.cpp's per-batch attention path choice.
    pub invariant_attn: bool,
}

/// A switch's value: on / off words, else `default` (also when unset).
fn parse_switch(v: Option<&str>, default: bool) -> bool {
    match v.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
        Some("1" | "on" | "true" | "yes") => true,
        Some("" | "0" | "off" | "false" | "no") => false,
        _ => default,
    }
}

fn switch(name: &str, default: bool) -> bool {
    parse_switch(std::env::var(name).ok().as_deref(), default)
}

/// The environment as read on the first call.
pub fn get() -> &'static Tuning {
    static T: OnceLock<Tuning> = OnceLock::new();
    T.get_or_init(|| Tuning {
        simd_cap: std::env::var("QUARREL_SIMD").ok().and_then(|s| Level::from_name(&s)),
        huge_pages: switch("QUARREL_HUGE_PAGES", true),
        profile: switch("QUARREL_CPU_PROFILE", false),
        invariant_attn: std::env::var("QUARREL_CPU_ATTN").map_or(true, |v| !v.trim().eq_ignore_ascii_case("llama")),
    })
}

/// (name, current value, meaning) of every variable this crate reads.
pub fn tuning_table() -> Vec<(&'static str, String, &'static str)> {
    let t = get();
    let on = |b: bool| if b { "1" } else { "0" }.to_string();
    vec![
        (
            "QUARREL_SIMD",
            t.simd_cap.map_or_else(|| "unset".into(), |l| l.name().to_string()),
            "cap on the kernels' instruction set (scalar, avx2, avx512, avx512vnni)",
        ),
        ("QUARREL_HUGE_PAGES", on(t.huge_pages), "transparent huge pages for kept panels, repacked weights, K/V"),
        ("QUARREL_CPU_PROFILE", on(t.profile), "thread-pool profile counters"),
        (
            "QUARREL_CPU_ATTN",
            if t.invariant_attn { "invariant" } else { "llama" }.into(),
            "f16-cache attention: one path for every batch (invariant) or llama.cpp's per-batch choice",
        ),
    ]
}

static REPACK: AtomicBool = AtomicBool::new(true);

/// Turn the repacked matmul (Q4_0, Q4_K, IQ4_NL) off or back on for this process, so a test
/// can compare it with the vec_dot-order kernels. Set it before the weights are first used.
pub fn set_repack(on: bool) {
    REPACK.store(on, Relaxed);
}

/// Whether the repacked matmul may run ([`set_repack`]; on by default).
pub(crate) fn repack_on() -> bool {
    REPACK.load(Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn switches_parse_on_off_words_else_default() {
        for (v, default, want) in [(None, true, true), (Some("0"), true, false), (Some(" Off"), true, false), (Some(""), true, false)] {
            assert_eq!(parse_switch(v, default), want, "{v:?}");
        }
        for (v, want) in [(Some("1"), true), (Some("yes"), true), (Some("maybe"), false), (None, false)] {
            assert_eq!(parse_switch(v, false), want, "{v:?}");
        }
    }

    #[test]
    fn the_table_names_every_variable_once() {
        let t = tuning_table();
        let mut names: Vec<&str> = t.iter().map(|r| r.0).collect();
        names.dedup();
        assert_eq!(names, ["QUARREL_SIMD", "QUARREL_HUGE_PAGES", "QUARREL_CPU_PROFILE", "QUARREL_CPU_ATTN"]);
        assert!(t.iter().all(|(_, v, m)| !v.is_empty() && !m.is_empty()));
    }
}
