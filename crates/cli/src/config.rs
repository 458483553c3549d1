//! Configuration files: `quarrel serve --config FILE` (a TOML table whose keys are the long
//! flag names) fills in every flag that neither the command line nor its `QUARREL_...`
//! environment variable set, so the precedence is flag > environment > file > default.
//!
//! The file is applied by rewriting the argument list: the arguments are parsed once to learn
//! which flags came from the command line or the environment (clap's `ValueSource`), the
//! file's other keys are appended as `--key=value`, and the result is parsed again. clap thus
//! validates file values exactly as it validates flags, with the same error messages.

use anyhow::{bail, Context, Result};
use clap::parser::ValueSource;
use std::path::PathBuf;

/// The id of the `--config` argument in the commands that take one.
pub const CONFIG_ID: &str = "config";

/// `argv` with the settings of the subcommand's `--config` file appended; `argv` unchanged when
/// the command takes no file, none was given, or the arguments do not parse (the real parse
/// reports that error). Also returns the file used.
pub fn apply(cmd: &clap::Command, argv: Vec<String>) -> Result<(Vec<String>, Option<PathBuf>)> {
    let Ok(matches) = cmd.clone().try_get_matches_from(&argv) else { return Ok((argv, None)) };
    let Some((name, sub)) = matches.subcommand() else { return Ok((argv, None)) };
    let Some(path) = sub.try_get_one::<PathBuf>(CONFIG_ID).ok().flatten().cloned() else { return Ok((argv, None)) };
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading config file {}", path.display()))?;
    let sc = cmd.find_subcommand(name).context("subcommand vanished")?;
    let extra = file_args(sc, sub, &text).with_context(|| format!("config file {}", path.display()))?;
    let mut out = argv;
    out.extend(extra);
    Ok((out, Some(path)))
}

/// The flags a config file's text adds to `sc`'s arguments, given what `matches` already has.
fn file_args(sc: &clap::Command, matches: &clap::ArgMatches, text: &str) -> Result<Vec<String>> {
    let table: toml::Table = text.parse().context("not valid TOML")?;
    let mut out = vec![];
    for (key, value) in &table {
        let long = key.replace('_', "-");
        let Some(arg) = sc.get_arguments().find(|a| a.get_long() == Some(long.as_str()) && a.get_id() != CONFIG_ID) else {
            bail!("unknown setting {key:?}; the settings are the long flags of `quarrel {}`: {}", sc.get_name(), known(sc));
        };
        let id = arg.get_id().as_str();
        // the command line and the environment win over the file
        if matches!(matches.value_source(id), Some(ValueSource::CommandLine | ValueSource::EnvVariable)) {
            continue;
        }
        let takes_value = arg.get_action().takes_values();
        let items: Vec<&toml::Value> = match value {
            toml::Value::Array(a) => a.iter().collect(),
            v => vec![v],
        };
        for v in items {
            let s = match v {
                toml::Value::String(s) => s.clone(),
                toml::Value::Integer(i) => i.to_string(),
                toml::Value::Float(f) => f.to_string(),
                toml::Value::Boolean(b) if !takes_value => {
                    if *b {
                        out.push(format!("--{long}"));
                    }
                    continue;
                }
                toml::Value::Boolean(b) => b.to_string(),
                other => bail!("setting {key:?}: {} values are not supported (use a string, number, boolean or list)", other.type_str()),
            };
            if !takes_value {
                bail!("setting {key:?} is a switch: give true or false, not {s:?}");
            }
            out.push(format!("--{long}={s}"));
        }
    }
    Ok(out)
}

fn known(sc: &clap::Command) -> String {
    let mut v: Vec<&str> = sc.get_arguments().filter(|a| a.get_id() != CONFIG_ID).filter_map(|a| a.get_long()).collect();
    v.retain(|l| *l != "help" && *l != "version");
    v.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Cli;
    use clap::{CommandFactory, Parser};

    fn serve(argv: &[&str]) -> crate::cmd::serve::Args {
        let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
        let (argv, _) = apply(&Cli::command(), argv).unwrap();
        match Cli::try_parse_from(argv).unwrap().cmd {
            crate::Command::Serve(a) => a,
            _ => unreachable!(),
        }
    }

    /// flag > environment > file > default, one setting of each kind, lists and switches too.
    /// The only test that sets these variables (the environment is process-wide).
    #[test]
    fn flag_beats_env_beats_file_beats_default() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("q.toml");
        std::fs::write(
            &f,
            "port = 9000\nctx = 2048\nthreads = 3\nkv_type = \"q8_0\"\nno-prefix-cache = true\n\
             cors-origin = [\"https://a.example\", \"https://b.example\"]\nqueue = 17\n",
        )
        .unwrap();
        std::env::set_var("QUARREL_CTX", "1024");
        std::env::set_var("QUARREL_THREADS", "5");
        std::env::set_var("QUARREL_QUEUE", "33");
        let a = serve(&["quarrel", "serve", "--config", f.to_str().unwrap(), "--threads", "7"]);
        std::env::remove_var("QUARREL_CTX");
        std::env::remove_var("QUARREL_THREADS");
        std::env::remove_var("QUARREL_QUEUE");
        assert_eq!(a.engine.ctx.threads, 7, "flag beats env and file");
        assert_eq!(a.engine.ctx.n_ctx, 1024, "env beats file");
        assert_eq!(a.queue, 33, "env beats file");
        assert_eq!(a.port, 9000, "file beats default");
        assert_eq!(a.engine.cache.kv.kv_type, "q8_0", "underscores name the same flag");
        assert!(a.no_prefix_cache, "a switch set by the file");
        assert_eq!(a.cors, ["https://a.example", "https://b.example"], "a list is a repeated flag");
        assert_eq!(a.engine.cache.batch, 512, "default when nobody sets it");
        assert_eq!(a.parallel, 64, "default when nobody sets it");
    }

    #[test]
    fn bad_files_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("q.toml");
        let run = |text: &str| {
            std::fs::write(&f, text).unwrap();
            let argv = vec!["quarrel".into(), "serve".into(), format!("--config={}", f.display())];
            apply(&Cli::command(), argv).map(|(a, _)| a).map_err(|e| format!("{e:#}"))
        };
        assert!(run("prot = 1").unwrap_err().contains("unknown setting \"prot\""));
        assert!(run("port = ").unwrap_err().contains("not valid TOML"));
        assert!(run("no-auth = \"yes\"").unwrap_err().contains("is a switch"));
        assert!(run("port = { value = 1 }").unwrap_err().contains("not supported"));
        assert!(run("[server]\nport = 1").unwrap_err().contains("unknown setting \"server\""));
        // a value of the wrong type is the same error as on the command line
        let argv = run("port = \"eighty\"").unwrap();
        assert!(Cli::try_parse_from(argv).is_err());
        assert!(apply(&Cli::command(), vec!["quarrel".into(), "serve".into(), "--config=/nonexistent/q.toml".into()]).is_err());
    }

    /// Every serve flag has a QUARREL_ variable, and the example file sets every flag.
    #[test]
    fn every_serve_flag_has_env_and_example_entry() {
        let cmd = Cli::command();
        let sc = cmd.find_subcommand("serve").unwrap();
        let example = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/quarrel.toml")).unwrap();
        let table: toml::Table = example.parse().unwrap();
        for a in sc.get_arguments() {
            let Some(long) = a.get_long() else { continue };
            if long == "help" || long == "version" {
                continue;
            }
            let env = a.get_env().map(|e| e.to_string_lossy().into_owned());
            let want = format!("QUARREL_{}", long.replace('-', "_").to_ascii_uppercase());
            assert_eq!(env.as_deref(), Some(want.as_str()), "--{long}");
            if long != CONFIG_ID {
                let commented = example.lines().any(|l| l.trim_start_matches(['#', ' ']).starts_with(&format!("{long} =")));
                assert!(table.contains_key(long) || commented, "deploy/quarrel.toml lacks {long}");
            }
        }
        let argv = vec![
            "quarrel".into(),
            "serve".into(),
            "--config".into(),
            concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/quarrel.toml").into(),
        ];
        let (argv, _) = apply(&cmd, argv).unwrap();
        Cli::try_parse_from(argv).unwrap();
    }
}
