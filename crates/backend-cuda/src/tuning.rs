//! The environment this crate reads, in one place, parsed once: what a user may need to set.
//!
//! | variable | meaning | default |
//! |----------|---------|---------|
//! | `QUARREL_CUDA_CACHE` | folder of the compiled kernel units | `$QUARREL_HOME/cuda`, else `~/.cache/quarrel/cuda` |
//! | `QUARREL_CUDA_GRAPHS` | `0`: launch kernels one by one, never as captured CUDA graphs | `1` |
//! | `QUARREL_CUDA_PROFILE` | `kernels`: GPU time per kernel (no graphs); `host`: host time per step and kernel; printed at exit | off |

use std::path::PathBuf;
use std::sync::OnceLock;

/// What to measure and print when the backend is dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Profile {
    Off,
    /// GPU time and launches per kernel (every launch timed with events; no graphs).
    Kernels,
    /// Where a step's wall time goes on the host (recording, submitting, waiting).
    Host,
}

/// The parsed environment.
#[derive(Debug)]
pub struct Tuning {
    pub cache_dir: PathBuf,
    pub graphs: bool,
    pub profile: Profile,
}

fn parse() -> Tuning {
    let cache_dir = if let Some(d) = std::env::var_os("QUARREL_CUDA_CACHE") {
        PathBuf::from(d)
    } else if let Some(h) = std::env::var_os("QUARREL_HOME") {
        PathBuf::from(h).join("cuda")
    } else {
        std::env::var_os("HOME")
            .map(|h| PathBuf::from(h).join(".cache/quarrel/cuda"))
            .unwrap_or_else(|| std::env::temp_dir().join("quarrel-cuda"))
    };
    let profile = match std::env::var("QUARREL_CUDA_PROFILE").as_deref() {
        Ok("host") => Profile::Host,
        Ok("0") | Ok("") | Err(_) => Profile::Off,
        Ok(_) => Profile::Kernels,
    };
    let graphs = std::env::var("QUARREL_CUDA_GRAPHS").map_or(true, |v| v != "0");
    Tuning { cache_dir, graphs, profile }
}

/// The environment, read at the first call.
pub fn get() -> &'static Tuning {
    static T: OnceLock<Tuning> = OnceLock::new();
    T.get_or_init(parse)
}

/// `(name, value, meaning)` of every variable this crate reads, with the value in effect
/// (`quarrel gpu` prints it).
pub fn tuning_table() -> Vec<(&'static str, String, &'static str)> {
    let t = get();
    let profile = match t.profile {
        Profile::Off => "off",
        Profile::Kernels => "kernels",
        Profile::Host => "host",
    };
    vec![
        ("QUARREL_CUDA_CACHE", t.cache_dir.display().to_string(), "folder of the compiled kernel units"),
        ("QUARREL_CUDA_GRAPHS", if t.graphs { "1" } else { "0" }.to_string(), "0: no CUDA graphs (kernels launched one by one)"),
        ("QUARREL_CUDA_PROFILE", profile.to_string(), "kernels: GPU time per kernel; host: host time per step; printed at exit"),
    ]
}
