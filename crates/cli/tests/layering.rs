//! The workspace's layering rule (ARCHITECTURE.md): each crate's `[dependencies]` on other
//! workspace crates stay inside what its layer may use, so measurement tools never leak into the
//! libraries and no library reaches up the stack.

use std::collections::BTreeMap;
use std::path::Path;

/// Crate folder -> the workspace crates (package names without `quarrel-`) it may depend on.
const ALLOWED: &[(&str, &[&str])] = &[
    ("quant", &[]),
    ("gguf", &["quant"]),
    ("core", &["gguf", "quant"]),
    ("backend-cpu", &["core", "gguf", "quant"]),
    ("backend-cuda", &["core", "gguf", "quant"]),
    ("tokenizer", &["gguf", "quant"]),
    ("models", &["core", "gguf", "quant"]),
    ("engine", &["core", "gguf", "quant", "models", "tokenizer"]),
    ("server", &["core", "gguf", "engine", "models", "tokenizer"]),
    ("flight", &["core", "engine", "models", "tokenizer"]),
    ("synth", &["core", "gguf", "quant", "models"]),
    ("bench", &["core", "gguf", "quant", "models", "engine", "tokenizer"]),
    ("loadtest", &[]),
];

/// The workspace crates named in the `[dependencies]` table of a Cargo.toml (dev- and build-
/// dependencies are not layering edges).
fn workspace_deps(manifest: &str) -> Vec<String> {
    let mut in_deps = false;
    let mut out = vec![];
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_deps = line == "[dependencies]";
            continue;
        }
        if in_deps {
            if let Some(name) = line.strip_prefix("quarrel-") {
                out.push(name.split([' ', '=', '.']).next().unwrap_or_default().to_string());
            }
        }
    }
    out
}

#[test]
fn library_crates_depend_only_down_the_stack() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("crates/");
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    let mut seen = 0;
    let mut violations = vec![];
    for entry in std::fs::read_dir(crates).expect("crates/ is readable") {
        let dir = entry.expect("a crates/ entry").path();
        let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        let Ok(manifest) = std::fs::read_to_string(dir.join("Cargo.toml")) else { continue };
        if name == "cli" {
            continue; // the binary wires everything together
        }
        let Some(ok) = allowed.get(name.as_str()) else {
            violations.push(format!("crates/{name} is not in the layering table of this test (add its layer)"));
            continue;
        };
        seen += 1;
        for dep in workspace_deps(&manifest) {
            // a package's folder name and package name differ for the two backends
            let dep_dir = match dep.as_str() {
                "cpu" => "backend-cpu",
                "cuda" => "backend-cuda",
                d => d,
            };
            if !ok.contains(&dep_dir) {
                violations.push(format!("crates/{name} depends on quarrel-{dep}"));
            }
        }
    }
    assert_eq!(seen, ALLOWED.len(), "every crate in the table exists");
    assert!(violations.is_empty(), "layering violations:\n{}", violations.join("\n"));
}

#[test]
fn the_dependency_reader_sees_only_normal_dependencies() {
    let manifest = "[package]\nname = \"x\"\n[dependencies]\nquarrel-core.workspace = true\nquarrel-engine = { path = \"../engine\" }\n\
                    serde = \"1\"\n[dev-dependencies]\nquarrel-synth.workspace = true\n";
    assert_eq!(workspace_deps(manifest), ["core", "engine"]);
}
