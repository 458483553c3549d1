//! `quarrel quantize` end to end: the built binary converts a tiny synthetic model, prints the
//! plan in a dry run, and rejects what it cannot do with messages that say why.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn quarrel(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_quarrel"))
        .args(args)
        .env("QUARREL_HOME", std::env::temp_dir().join("quarrel-quantize-test-home"))
        .output()
        .expect("running quarrel")
}

fn tiny_model(dir: &Path, quant: &str) -> PathBuf {
    let p = dir.join(format!("tiny-{quant}.gguf"));
    let o = quarrel(&["synth", "--preset", "tiny", "--quant", quant, "--quiet", p.to_str().unwrap()]);
    assert!(o.status.success(), "synth failed: {}", text(&o.stderr));
    p
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn unknown_type_is_rejected_with_the_valid_ones() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model(dir.path(), "f32");
    let out = dir.path().join("out.gguf");
    let o = quarrel(&["quantize", m.to_str().unwrap(), out.to_str().unwrap(), "Q4_K_X"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    let e = text(&o.stderr);
    assert!(e.contains("unknown type \"Q4_K_X\"; valid types: "), "{e}");
    for name in ["Q4_0", "Q8_0", "Q4_K_M", "IQ4_NL", "F16", "BF16"] {
        assert!(e.contains(name), "{name} missing from: {e}");
    }
    assert!(!out.exists());
    let o = quarrel(&["quantize", "--output-tensor-type", "q9", m.to_str().unwrap(), out.to_str().unwrap(), "q8_0"]);
    assert!(text(&o.stderr).contains("unknown tensor type \"q9\""), "{}", text(&o.stderr));
}

#[test]
fn converts_plans_and_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model(dir.path(), "f32");
    let q8 = dir.path().join("q8.gguf");
    let o = quarrel(&["quantize", "--quiet", "-t", "2", m.to_str().unwrap(), q8.to_str().unwrap(), "q8_0"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let s = text(&o.stdout);
    assert!(s.contains("(q8_0): 21 tensors (") && s.contains(" MiB -> "), "{s}");

    // the output loads and shows its new type
    let o = quarrel(&["inspect", q8.to_str().unwrap()]);
    let s = text(&o.stdout);
    assert!(s.lines().any(|l| l.starts_with("general.file_type") && l.trim_end().ends_with(" 7")), "{s}");

    let o = quarrel(&["quantize", "--dry-run", q8.to_str().unwrap(), "Q4_K_M"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let s = text(&o.stdout);
    assert!(s.contains("blk.1.attn_v.weight") && s.contains("q8_0 -> q6_K"), "{s}");
    assert!(text(&o.stderr).contains("--allow-requantize"), "{}", text(&o.stderr));
    assert!(!dir.path().join("Q4_K_M").exists());

    let q4 = dir.path().join("q4.gguf");
    let o = quarrel(&["quantize", q8.to_str().unwrap(), q4.to_str().unwrap(), "Q4_K_M"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("requantizing from type q8_0 is disabled"), "{}", text(&o.stderr));
    assert!(!q4.exists());
    let o = quarrel(&["quantize", "--quiet", "--allow-requantize", q8.to_str().unwrap(), q4.to_str().unwrap(), "Q4_K_M"]);
    assert!(o.status.success(), "{}", text(&o.stderr));

    let o = quarrel(&["quantize", m.to_str().unwrap(), m.to_str().unwrap(), "q8_0"]);
    assert!(text(&o.stderr).contains("input and output files are the same"), "{}", text(&o.stderr));
    let junk = dir.path().join("junk.gguf");
    std::fs::write(&junk, b"not a model").unwrap();
    let o = quarrel(&["quantize", junk.to_str().unwrap(), q4.to_str().unwrap(), "q8_0"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("reading "), "{}", text(&o.stderr));
}
