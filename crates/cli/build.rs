//! Build script: stamps the binary with the git commit it was built from, for `--version`.
//!
//! `QUARREL_GIT_COMMIT` in the build environment wins (container builds copy the sources
//! without `.git` and pass the commit as a build argument); otherwise `git` is asked; without
//! either the version says `unknown` rather than failing the build.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-env-changed=QUARREL_GIT_COMMIT");
    let commit = std::env::var("QUARREL_GIT_COMMIT").ok().filter(|s| !s.trim().is_empty()).or_else(|| {
        let c = git(&["rev-parse", "--short=12", "HEAD"])?;
        // rebuild when HEAD moves (a checkout) or the branch it names moves (a commit)
        for p in ["HEAD", "index"] {
            if let Some(path) = git(&["rev-parse", "--git-path", p]) {
                println!("cargo:rerun-if-changed={path}");
            }
        }
        if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]).and_then(|r| git(&["rev-parse", "--git-path", &r])) {
            println!("cargo:rerun-if-changed={r}");
        }
        let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some();
        Some(if dirty { format!("{c}-dirty") } else { c })
    });
    println!("cargo:rustc-env=QUARREL_GIT_COMMIT={}", commit.unwrap_or_else(|| "unknown".into()));
}
