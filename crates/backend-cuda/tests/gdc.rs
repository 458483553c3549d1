//! Every kernel launched with programmatic dependent launch (`quarrel_cuda::waiting_kernel_names`) must
//! wait for its predecessor (`GDC()`) before touching memory, or it races the kernel before it.
//! Checked on the kernel sources (no GPU needed): each `extern "C" __global__` kernel, macro
//! templates included, must call `GDC()` in its body or call a device function whose body does;
//! every listed name must be defined by such a kernel.

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
        let is_param = !p.is_empty() && p.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_') && p.chars().any(|c| c.is_ascii_uppercase());
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

#[test]
fn every_pdl_kernel_waits_for_its_predecessor() {
    let src: String = SOURCES.iter().map(|s| s.replace("\\\n", "\n")).collect::<Vec<_>>().join("\n");
    let waiting = waiting_functions(&src);
    let ks = kernels(&src);
    assert!(ks.len() > 15, "found only {} kernels", ks.len());
    let good: Vec<&String> = ks
        .iter()
        .filter(|(_, b)| b.contains("GDC();") || waiting.iter().any(|f| b.contains(&format!("{f}<")) || b.contains(&format!("{f}("))))
        .map(|(n, _)| n)
        .collect();
    for name in quarrel_cuda::waiting_kernel_names() {
        assert!(good.iter().any(|p| matches(p, &name)), "{name} is launched with PDL but no kernel of that name calls GDC()");
    }
    // and the check can fail: a kernel without GDC() is not accepted
    assert!(!ks.iter().any(|(n, b)| n == "zero_fill" && !b.contains("GDC();")));
    assert!(matches("gemv3_##NAME##_##NT", "gemv3_q4_0_1") && !matches("gemv3_##NAME##_##NT", "gemv_q4_0_1"));
}

/// Every kernel of the registry (`quarrel_cuda::kernel_registry`, looked up when the device
/// starts: a missing one fails the start) is defined by a kernel of the sources, and is listed
/// once.
#[test]
fn every_registered_kernel_is_defined_once() {
    let src: String = SOURCES.iter().map(|s| s.replace("\\\n", "\n")).collect::<Vec<_>>().join("\n");
    let ks = kernels(&src);
    let reg = quarrel_cuda::kernel_registry();
    assert!(reg.len() > 100, "only {} kernels registered", reg.len());
    let mut seen = std::collections::HashSet::new();
    for (name, _) in &reg {
        assert!(seen.insert(name.clone()), "{name} is registered twice");
        assert!(ks.iter().any(|(p, _)| matches(p, name)), "{name} is registered but no kernel of the sources defines it");
    }
    // and the check can fail
    assert!(!ks.iter().any(|(p, _)| matches(p, "no_such_kernel")));
}
