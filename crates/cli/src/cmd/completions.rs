//! `quarrel completions SHELL` and `quarrel man`: shell completion scripts (clap_complete) and
//! roff man pages (clap_mangen), both generated from the same clap definitions as `--help`,
//! so they never disagree with the binary.

use anyhow::{Context, Result};
use clap::CommandFactory;
use std::path::PathBuf;

/// Print a shell completion script.
///
/// bash: `quarrel completions bash > ~/.local/share/bash-completion/completions/quarrel`;
/// zsh: `quarrel completions zsh > "${fpath[1]}/_quarrel"`;
/// fish: `quarrel completions fish > ~/.config/fish/completions/quarrel.fish`.
#[derive(clap::Args)]
pub struct CompletionArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

pub fn completions(a: CompletionArgs) -> Result<()> {
    let mut cmd = crate::Cli::command();
    clap_complete::generate(a.shell, &mut cmd, "quarrel", &mut std::io::stdout());
    Ok(())
}

/// Print the man page, or write one page per command into a directory.
///
/// `quarrel man | man -l -` shows it; `quarrel man --out-dir /usr/local/share/man/man1`
/// installs quarrel.1 and quarrel-COMMAND.1 for every command.
#[derive(clap::Args)]
pub struct ManArgs {
    /// Write quarrel.1 and quarrel-COMMAND.1 pages into this directory instead of printing.
    #[arg(long = "out-dir", value_name = "DIR")]
    pub out_dir: Option<PathBuf>,
}

pub fn man(a: ManArgs) -> Result<()> {
    let cmd = crate::Cli::command();
    match a.out_dir {
        None => clap_mangen::Man::new(cmd).render(&mut std::io::stdout()).context("writing the man page"),
        Some(dir) => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            clap_mangen::generate_to(cmd, &dir).with_context(|| format!("writing man pages into {}", dir.display()))?;
            eprintln!("man pages written to {}", dir.display());
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each shell's script names the commands and the serve flags.
    #[test]
    fn completions_for_three_shells_name_commands_and_flags() {
        for shell in [clap_complete::Shell::Bash, clap_complete::Shell::Zsh, clap_complete::Shell::Fish] {
            let mut buf = vec![];
            clap_complete::generate(shell, &mut crate::Cli::command(), "quarrel", &mut buf);
            let s = String::from_utf8(buf).unwrap();
            for word in ["serve", "pull", "completions", "kv-mem", "config"] {
                assert!(s.contains(word), "{shell}: no {word}");
            }
        }
    }

    #[test]
    fn man_pages_cover_every_command() {
        let dir = tempfile::tempdir().unwrap();
        man(ManArgs { out_dir: Some(dir.path().into()) }).unwrap();
        let top = std::fs::read_to_string(dir.path().join("quarrel.1")).unwrap();
        assert!(top.starts_with(".ie") || top.contains(".TH"), "roff");
        for sc in crate::Cli::command().get_subcommands() {
            assert!(dir.path().join(format!("quarrel-{}.1", sc.get_name())).exists(), "{}", sc.get_name());
        }
    }
}
