//! `quarrel bench` end to end: the built binary on a tiny synthetic model.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn quarrel(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_quarrel"))
        .args(args)
        .env("QUARREL_HOME", std::env::temp_dir().join("quarrel-bench-test-home"))
        .output()
        .expect("running quarrel")
}

fn tiny_model(dir: &Path) -> PathBuf {
    let p = dir.join("tiny-q4_0.gguf");
    let o = quarrel(&["synth", "--preset", "tiny", "--quant", "q4_0", "--quiet", p.to_str().unwrap()]);
    assert!(o.status.success(), "synth failed: {}", String::from_utf8_lossy(&o.stderr));
    p
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn bench_json_has_llama_bench_fields() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model(dir.path());
    let o = quarrel(&["bench", "-m", m.to_str().unwrap(), "-t", "1,2", "-p", "16", "-n", "8", "-r", "2", "-o", "json"]);
    assert!(o.status.success(), "bench failed: {}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("stdout is one JSON document");
    let rows = v.as_array().expect("a JSON list");
    // 2 thread counts x (pp16, tg8)
    assert_eq!(rows.len(), 4, "{v:#}");
    let mut tests = vec![];
    for r in rows {
        for k in [
            "build_commit",
            "backends",
            "backend",
            "model_filename",
            "model_type",
            "model_size",
            "model_n_params",
            "n_batch",
            "n_threads",
            "n_prompt",
            "n_gen",
            "test_time",
            "avg_ns",
            "stddev_ns",
            "avg_ts",
            "stddev_ts",
            "samples_ns",
            "samples_ts",
            "load_ms",
        ] {
            assert!(r.get(k).is_some(), "field {k} missing in {r:#}");
        }
        assert_eq!(r["model_filename"].as_str().unwrap(), m.to_str().unwrap());
        assert!(r["model_size"].as_u64().unwrap() > 0);
        assert!(r["model_n_params"].as_u64().unwrap() > 0);
        assert!(r["avg_ts"].as_f64().unwrap() > 0.0, "{r:#}");
        assert!(r["stddev_ts"].as_f64().unwrap() >= 0.0);
        assert!(r["avg_ns"].as_u64().unwrap() > 0);
        assert!(r["load_ms"].as_f64().unwrap() > 0.0);
        let ns = r["samples_ns"].as_array().unwrap();
        let ts = r["samples_ts"].as_array().unwrap();
        assert_eq!((ns.len(), ts.len()), (2, 2));
        // t/s of each sample is tokens / seconds of that sample
        let n_tok = r["n_prompt"].as_u64().unwrap() + r["n_gen"].as_u64().unwrap();
        for (a, b) in ns.iter().zip(ts) {
            let want = n_tok as f64 * 1e9 / a.as_u64().unwrap() as f64;
            assert!((b.as_f64().unwrap() - want).abs() <= 1e-6 * want, "{a} {b}");
        }
        let mean = ts.iter().map(|x| x.as_f64().unwrap()).sum::<f64>() / 2.0;
        assert!((r["avg_ts"].as_f64().unwrap() - mean).abs() <= 1e-6 * mean);
        tests.push((r["n_threads"].as_u64().unwrap(), r["n_prompt"].as_u64().unwrap(), r["n_gen"].as_u64().unwrap()));
    }
    assert_eq!(tests, vec![(1, 16, 0), (1, 0, 8), (2, 16, 0), (2, 0, 8)]);
    assert!(stderr(&o).contains("bench:"), "progress goes to stderr");
}

#[test]
fn bench_markdown_and_profile() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model(dir.path());
    let o = quarrel(&["bench", "-m", m.to_str().unwrap(), "-t", "1", "-p", "8", "-n", "4", "--pg", "8,4", "-r", "1", "--profile"]);
    assert!(o.status.success(), "bench failed: {}", stderr(&o));
    let out = String::from_utf8(o.stdout).unwrap();
    let head = out.lines().next().unwrap();
    for col in ["model", "size", "params", "backend", "threads", "test", "t/s"] {
        assert!(head.contains(col), "{out}");
    }
    for t in ["pp8", "tg4", "pp8+tg4"] {
        assert!(out.lines().any(|l| l.split('|').any(|c| c.trim() == t)), "{t} missing:\n{out}");
    }
    assert!(out.contains(" ± "), "{out}");
    assert!(out.contains("load: "), "{out}");
    assert!(out.contains("profile: tg4"), "{out}");
    // and the longest prompt test, per prompt
    assert!(out.contains("profile: pp8") && out.contains("calls/prompt"), "{out}");
    assert!(out.contains("matmul q4_0"), "{out}");
    assert!(out.contains("attention"), "{out}");
}

#[test]
fn bench_bad_arguments_fail_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model(dir.path());
    let m = m.to_str().unwrap();
    let missing = dir.path().join("no-such-model.gguf");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["-m", m, "-t", "0"], "at least 1"),
        (vec!["-m", m, "-t", ""], "empty list"),
        (vec!["-m", m, "-t", "two"], "invalid value"),
        (vec!["-m", m, "-p", "0", "-n", "0"], "nothing to benchmark"),
        (vec!["-m", m, "-r", "0"], "repetition"),
        (vec!["-m", m, "--pg", "8"], "--pg"),
        (vec!["-m", missing.to_str().unwrap(), "-p", "8", "-n", "0"], "not found"),
        (vec!["-m", m, "-o", "xml"], "invalid value"),
        (vec!["-m", m, "--numerics", "approximate"], "invalid value"),
    ];
    for (args, want) in cases {
        let mut all = vec!["bench"];
        all.extend(&args);
        let o = quarrel(&all);
        assert!(!o.status.success(), "{args:?} should fail");
        assert!(o.stdout.is_empty(), "{args:?} printed results");
        assert!(stderr(&o).contains(want), "{args:?}: expected {want:?} in:\n{}", stderr(&o));
    }
}

/// `--numerics exact` is accepted on every device (the CPU always computes exactly; on a GPU it
/// turns on the CUDA backend's exact numerics) and measures like the default.
#[test]
fn bench_takes_numerics() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model(dir.path());
    for numerics in ["fast", "exact"] {
        let o = quarrel(&[
            "bench",
            "-m",
            m.to_str().unwrap(),
            "--device",
            "cpu",
            "--numerics",
            numerics,
            "-t",
            "1",
            "-p",
            "8",
            "-n",
            "4",
            "-r",
            "1",
            "-o",
            "json",
        ]);
        assert!(o.status.success(), "--numerics {numerics}: {}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("stdout is one JSON document");
        assert_eq!(v.as_array().map(|r| r.len()), Some(2), "{v:#}");
    }
}

/// `--draft-model` / `--spec ngram`: a second table, greedy generation after real prompts with
/// and without the drafter; a model drafting for itself agrees with every draft.
#[test]
fn bench_with_a_drafter_compares_speculative_decoding() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model(dir.path());
    let ms = m.to_str().unwrap();
    let o = quarrel(&["bench", "-m", ms, "--draft-model", ms, "-t", "2", "-p", "0", "-n", "24", "-r", "2"]);
    assert!(o.status.success(), "bench failed: {}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("speculative decoding"), "{out}");
    // the two built-in prompts, each the same text with and without drafts, all accepted
    for prompt in ["story", "code"] {
        let row = out.lines().find(|l| l.contains(&format!("| {prompt} "))).unwrap_or_else(|| panic!("no {prompt} row: {out}"));
        assert!(row.contains("tg24") && row.contains("| yes"), "{row}");
        assert!(row.contains("100% ("), "a model drafting for itself: {row}");
    }
    // prompt lookup with a prompt of our own
    let o = quarrel(&[
        "bench",
        "-m",
        ms,
        "--spec",
        "ngram",
        "--spec-prompt",
        "one two three one two three one two",
        "-p",
        "0",
        "-n",
        "16",
        "-r",
        "1",
    ]);
    assert!(o.status.success(), "bench failed: {}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let row = out.lines().find(|l| l.contains("| prompt 1 ")).unwrap_or_else(|| panic!("no prompt row: {out}"));
    assert!(row.contains("tg16") && row.contains("| yes"), "{row}");
    // no generation length: a clear error before anything loads
    let o = quarrel(&["bench", "-m", ms, "--spec", "ngram", "-p", "16", "-n", "0"]);
    assert!(!o.status.success() && stderr(&o).contains("need a generation length"), "{}", stderr(&o));
}
