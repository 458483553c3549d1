//! The kernel registry (`quarrel_cuda::KERNELS`, derived from the kernel sources by build.rs)
//! held to the sources and to the launch code, no GPU needed. A kernel launched with
//! programmatic dependent launch must wait for its predecessor (`GDC()`) before touching memory,
//! or it races the kernel before it; a kernel the launch code names but the registry lacks fails
//! at the launch. Checked here with a scanner of its own: each `extern "C" __global__` kernel,
//! macro templates included, and whether its body calls `GDC()` or a device function that does.

const SOURCES: [&str; 15] = [
    include_str!("../kernels/common.cuh"),
    include_str!("../kernels/ops.cu"),
    include_str!("../kernels/sample.cu"),
    include_str!("../kernels/matmul.cu"),
    include_str!("../kernels/attention.cu"),
    include_str!("../kernels/attn_batch.cu"),
    include_str!("../kernels/mmq.cu"),
    include_str!("../kernels/moe.cu"),
    include_str!("../kernels/ssm.cu"),
    include_str!("../kernels/exact.cu"),
    include_str!("../kernels/attn_vec.cu"),
    include_str!("../kernels/attn_mma.cu"),
    include_str!("../kernels/gelu.cu"),
    include_str!("../kernels/gemvm.cu"),
    include_str!("../kernels/norm_row.cuh"),
];

/// Every kernel source of the crate is in `SOURCES` (a new file must be added there too). The
/// folder is the one the binary was built from, or `kernels` under the working directory where
/// that path is gone (a prebuilt test binary run from the crate's folder of another checkout,
/// as scripts/gpu-test.sh does on the GPU machine).
#[test]
fn sources_cover_every_kernel_file() {
    let built = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
    let dir = if built.is_dir() { built } else { std::path::PathBuf::from("kernels") };
    assert!(dir.is_dir(), "no kernel folder at {} (run from crates/backend-cuda)", dir.display());
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(SOURCES.contains(&text.as_str()), "{} is not in tests/gdc.rs SOURCES", p.display());
    }
}

/// The text from the `{` at or after `from` to its matching `}`.
fn body(src: &str, from: usize) -> &str {
    let open = from + src[from..].find('{').expect("a body");
    let mut depth = 0;
    for (i, c) in src[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return &src[open..open + i + 1];
                }
            }
            _ => {}
        }
    }
    &src[open..]
}

/// `(name pattern, body)` of every `extern "C" __global__` kernel (macro line continuations
/// removed; `##` joins in the pattern are kept).
fn kernels(src: &str) -> Vec<(String, String)> {
    let mut out = vec![];
    let mut at = 0;
    while let Some(k) = src[at..].find("extern \"C\" __global__ void") {
        let start = at + k;
        let head = &src[start..];
        let paren = head.find('(').unwrap();
        // `__launch_bounds__(128) name(` / `__cluster_dims__(4, 1, 1) name(`: the name follows
        // the attribute's parentheses
        let (name_from, name_to) = if head[..paren].contains("__launch_bounds__") || head[..paren].contains("__cluster_dims__") {
            // the attribute's matching `)` (its arguments may hold parentheses)
            let mut depth = 0;
            let close = paren
                + head[paren..]
                    .char_indices()
                    .find(|&(_, c)| {
                        depth += (c == '(') as i32 - (c == ')') as i32;
                        depth == 0
                    })
                    .unwrap()
                    .0
                + 1;
            let p2 = close + head[close..].find('(').unwrap();
            (close, p2)
        } else {
            ("extern \"C\" __global__ void".len(), paren)
        };
        // the last word before the parameters (a launch-bounds macro may come first)
        let name = head[name_from..name_to].split_whitespace().last().unwrap_or("").to_string();
        out.push((name, body(src, start).to_string()));
        at = start + 1;
    }
    out
}

/// Names of device functions whose body calls `GDC()`.
fn waiting_functions(src: &str) -> Vec<String> {
    let mut out = vec![];
    let mut at = 0;
    while let Some(k) = src[at..].find("__device__ __forceinline__ void ") {
        let start = at + k + "__device__ __forceinline__ void ".len();
        let name: String = src[start..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        if body(src, start).contains("GDC();") {
            out.push(name);
        }
        at = start;
    }
    out
}

/// Whether `name` matches a macro pattern such as `gemv_##NAME##_##NT`.
fn matches(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split("##").collect();
    if parts.len() == 1 {
        return pattern == name;
    }
    // literal pieces in order; macro parameters (upper-case words) match anything
    let mut rest = name;
    for (i, p) in parts.iter().enumerate() {
        let is_param = !p.is_empty()
            && p.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
            && p.chars().any(|c| c.is_ascii_uppercase());
        if is_param {
            continue;
        }
        match rest.find(p) {
            Some(pos) if i > 0 || pos == 0 => rest = &rest[pos + p.len()..],
            _ => return false,
        }
    }
    true
}

/// Whether a kernel body waits (calls `GDC()` or a device function whose body does).
fn body_waits(b: &str, waiting: &[String]) -> bool {
    b.contains("GDC();") || waiting.iter().any(|f| b.contains(&format!("{f}<")) || b.contains(&format!("{f}(")))
}

/// Each registered kernel's wait flag agrees with its body: a waiting kernel is defined by a
/// kernel that calls `GDC()`, a plain one by no kernel that does.
#[test]
fn every_registered_wait_flag_matches_the_kernel_body() {
    let src: String = SOURCES.iter().map(|s| s.replace("\\\n", "\n")).collect::<Vec<_>>().join("\n");
    let waiting = waiting_functions(&src);
    let ks = kernels(&src);
    assert!(ks.len() > 15, "found only {} kernels", ks.len());
    let (mut n_wait, mut n_plain) = (0, 0);
    for &(_, name, waits) in quarrel_cuda::KERNELS {
        let defs: Vec<&(String, String)> = ks.iter().filter(|(p, _)| matches(p, name)).collect();
        if waits {
            n_wait += 1;
            assert!(
                defs.iter().any(|(_, b)| body_waits(b, &waiting)),
                "{name} is launched with PDL but no kernel of that name calls GDC()"
            );
        } else {
            n_plain += 1;
            assert!(defs.iter().all(|(_, b)| !body_waits(b, &waiting)), "{name} calls GDC() but is registered as not waiting");
        }
    }
    assert!(n_wait > 100 && n_plain > 50, "{n_wait} waiting, {n_plain} plain kernels");
    // and the check can fail: a kernel without GDC() is not accepted
    assert!(!ks.iter().any(|(n, b)| n == "zero_fill" && !b.contains("GDC();")));
    assert!(ks.iter().any(|(n, b)| n == "mmq_reduce" && !body_waits(b, &waiting)));
    assert!(matches("gemv3_##NAME##_##NT", "gemv3_q4_0_1") && !matches("gemv3_##NAME##_##NT", "gemv_q4_0_1"));
}

/// Every kernel of the registry (looked up when the device starts: a missing one fails the
/// start) is defined by a kernel of the sources, and is listed once.
#[test]
fn every_registered_kernel_is_defined_once() {
    let src: String = SOURCES.iter().map(|s| s.replace("\\\n", "\n")).collect::<Vec<_>>().join("\n");
    let ks = kernels(&src);
    let reg = quarrel_cuda::KERNELS;
    assert!(reg.len() > 100, "only {} kernels registered", reg.len());
    let mut seen = std::collections::HashSet::new();
    for &(file, name, _) in reg {
        assert!(seen.insert(name), "{name} is registered twice");
        assert!(ks.iter().any(|(p, _)| matches(p, name)), "{name} is registered but no kernel of the sources defines it");
        assert!(file.ends_with(".cu") || file.ends_with(".cuh"), "{name} from {file}");
    }
    // and the check can fail
    assert!(!ks.iter().any(|(p, _)| matches(p, "no_such_kernel")));
}

/// The crate's Rust sources (the folder it was built from, or `src` under the working directory).
fn rust_sources() -> Vec<String> {
    let built = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let root = if built.is_dir() { built } else { std::path::PathBuf::from("src") };
    let mut out = vec![];
    let mut dirs = vec![root];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(std::fs::read_to_string(&p).unwrap());
            }
        }
    }
    out
}

/// The kernel names (`{..}` holes for `format!` arguments) the launch code passes to the
/// launch and lookup calls as a string literal or a `format!`.
fn launched_names(rs: &str) -> Vec<String> {
    let mut out = vec![];
    for call in [".launch(", ".launch_now(", ".launch_1d(", ".launch_1d_now(", ".func(", ".resident_blocks("] {
        for (at, _) in rs.match_indices(call) {
            let arg = rs[at + call.len()..].trim_start().trim_start_matches('&');
            let arg = arg.strip_prefix("format!(").unwrap_or(arg);
            if let Some(lit) = arg.strip_prefix('"') {
                out.push(lit[..lit.find('"').unwrap()].to_string());
            }
        }
    }
    out
}

/// Whether a launched name with `{..}` holes (each one or more characters) can be `name`.
fn launched_matches(pattern: &str, name: &str) -> bool {
    match pattern.find('{') {
        None => pattern == name,
        Some(open) => {
            let Some(left) = name.strip_prefix(&pattern[..open]) else { return false };
            let rest = &pattern[open + pattern[open..].find('}').unwrap() + 1..];
            (1..=left.len()).any(|k| left.is_char_boundary(k) && launched_matches(rest, &left[k..]))
        }
    }
}

/// Every kernel name the launch code passes literally (or as a `format!` pattern) is in the
/// registry, so no launch asks the device for a kernel it did not look up.
#[test]
fn every_launched_kernel_is_registered() {
    let names: Vec<String> = rust_sources().iter().flat_map(|s| launched_names(s)).collect();
    assert!(names.len() > 30, "found only {} launched names", names.len());
    for n in &names {
        assert!(quarrel_cuda::KERNELS.iter().any(|&(_, k, _)| launched_matches(n, k)), "{n} is launched but is in no kernel source");
    }
    // and the check can fail
    assert!(launched_matches("gemv_{name}_{nt}", "gemv_q4_0_1") && !launched_matches("gemv_{name}_{nt}", "gemv3_q4_0_1"));
    assert!(!quarrel_cuda::KERNELS.iter().any(|&(_, k, _)| launched_matches("no_such_kernel", k)));
}
