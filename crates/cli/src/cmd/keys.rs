//! `quarrel keys create|list|revoke`: manage the API keys file `quarrel serve` checks.

use crate::resolve::cache_dir;
use anyhow::Result;
use quarrel_server::KeyFile;
use std::path::{Path, PathBuf};

/// Manage API keys for `quarrel serve` (stored hashed; a key is shown once, at creation).
///
/// The server re-reads the file when it changes: a revoked key stops working at once.
#[derive(clap::Args)]
pub struct Args {
    /// Keys file (default: $QUARREL_HOME/keys.json).
    #[arg(long = "keys", global = true)]
    pub keys: Option<PathBuf>,
    #[command(subcommand)]
    pub cmd: KeysCmd,
}

#[derive(clap::Subcommand)]
pub enum KeysCmd {
    /// Create a key and print it (the only time it is shown).
    Create {
        /// A name to recognize the key by.
        name: String,
        /// Print JSON ({"id", "name", "key"}) instead of the bare key.
        #[arg(long)]
        json: bool,
    },
    /// List keys (ids, names, prefixes, state; never the keys).
    List {
        #[arg(long)]
        json: bool,
    },
    /// Revoke a key by id, name or prefix.
    Revoke { id: String },
}

pub fn default_path() -> PathBuf {
    cache_dir().parent().unwrap_or(Path::new(".")).join("keys.json")
}

pub fn main(a: Args) -> Result<()> {
    let path = a.keys.unwrap_or_else(default_path);
    let mut f = KeyFile::load(&path)?;
    match a.cmd {
        KeysCmd::Create { name, json } => {
            let (key, rec) = f.create(&name);
            f.save(&path)?;
            if json {
                println!("{}", serde_json::json!({"id": rec.id, "name": rec.name, "key": key}));
            } else {
                println!("{key}");
            }
            eprintln!("created {} ({}) in {}; store the key now: it is not kept", rec.id, rec.name, path.display());
        }
        KeysCmd::List { json } => {
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(
                        &f.keys
                            .iter()
                            .map(|k| serde_json::json!({
                                "id": k.id, "name": k.name, "prefix": k.prefix, "created": k.created, "revoked": k.revoked,
                            }))
                            .collect::<Vec<_>>()
                    )?
                );
            } else {
                println!("{:<14} {:<20} {:<10} {:<12} state", "id", "name", "prefix", "created");
                for k in &f.keys {
                    let state = if k.revoked.is_some() { "revoked" } else { "active" };
                    println!("{:<14} {:<20} {:<10} {:<12} {state}", k.id, k.name, k.prefix, k.created);
                }
            }
        }
        KeysCmd::Revoke { id } => {
            let n = f.revoke(&id)?;
            f.save(&path)?;
            eprintln!("revoked {n} key(s) matching {id:?}");
        }
    }
    Ok(())
}
