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

/// One NVRTC program: its files in order (a file that uses another's macros or templates names
/// it first; a kernel compiled into several units is looked up in the first that has it) and
/// defines put before them (e.g. one KV type of the attention kernels per unit).
pub struct Unit {
    pub name: &'static str,
    pub files: &'static [&'static str],
    pub defines: &'static str,
}

/// The kernel sources: `files` (name, text; the first opens every unit) and the units
/// compiled from them.
pub struct Program {
    pub files: &'static [(&'static str, &'static str)],
    pub units: &'static [Unit],
}

impl Program {
    fn file(&self, name: &str) -> &'static str {
        self.files
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, s)| *s)
            .unwrap_or_else(|| panic!("kernel file {name} missing from the program's files"))
    }

    /// A unit's whole source: its defines, then the first file and the unit's files.
    pub(crate) fn unit_source(&self, u: &Unit) -> String {
        let mut s = String::new();
        s.push_str(u.defines);
        for name in std::iter::once(self.files[0].0).chain(u.files.iter().copied()) {
            s.push_str(&format!("// ---- {name}\n{}\n", self.file(name)));
        }
        s
    }
}

/// FNV-1a, stable across builds (the cache key).
pub(crate) fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf29ce484222325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100000001b3))
}

/// What NVRTC produces for a unit: a CUBIN for `sm_XY` or PTX for `compute_XY`.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Target {
    Cubin,
    Ptx,
}

fn cache_file(dir: &Path, p: &Program, u: &Unit, cc: (i32, i32), t: Target) -> PathBuf {
    let (arch, ext) = match t {
        Target::Cubin => (format!("sm_{}{}", cc.0, cc.1), "cubin"),
        Target::Ptx => (format!("compute_{}{}", cc.0, cc.1), "ptx"),
    };
    dir.join(format!("{}-{:016x}-{arch}.{ext}", u.name, fnv(&p.unit_source(u))))
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
pub(crate) fn compile_unit(dir: &Path, p: &Program, u: &Unit, cc: (i32, i32), t: Target) -> Result<Ptx, CudaError> {
    let path = cache_file(dir, p, u, cc, t);
    if let Ok(bytes) = std::fs::read(&path) {
        return Ok(as_ptx(t, bytes));
    }
    let arch = match t {
        Target::Cubin => format!("sm_{}{}", cc.0, cc.1),
        Target::Ptx => format!("compute_{}{}", cc.0, cc.1),
    };
    let mut bytes =
        nvrtc(&p.unit_source(u), u.name, &arch, t).map_err(|log| CudaError::Compile(format!("kernel unit {}: {log}", u.name)))?;
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
pub(crate) fn compile_all(dir: &Path, p: &Program, cc: (i32, i32)) -> Result<Vec<Ptx>, CudaError> {
    let missing = p.units.iter().filter(|u| !cache_file(dir, p, u, cc, Target::Cubin).exists()).count();
    if missing > 0 {
        // SAFETY: only probes for the shared library.
        if !unsafe { sys::is_culib_present() } {
            return Err(CudaError::NoDevice(
                "NVRTC (libnvrtc.so) not found: install the CUDA toolkit's runtime compiler or add it to LD_LIBRARY_PATH".into(),
            ));
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
        let hs: Vec<_> = p.units.iter().map(|u| s.spawn(move || compile_unit(dir, p, u, cc, Target::Cubin))).collect();
        hs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(CudaError::Compile("an NVRTC thread panicked".into())))).collect()
    });
    bar.finish_and_clear();
    if missing > 0 {
        eprintln!("compiled {missing} CUDA kernel units for sm_{}{} in {:.0} s", cc.0, cc.1, t0.elapsed().as_secs_f64());
    }
    out.into_iter().collect()
}
