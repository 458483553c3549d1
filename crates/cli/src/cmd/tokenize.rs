//! `quarrel tokenize`: token ids of a text, as llama-tokenize prints them.

use crate::args::ModelArgs;
use anyhow::{bail, Context, Result};
use std::io::Read;

/// Print the token ids of a text.
///
/// BOS/EOS are added per the model's metadata; special tokens such as <|im_start|> in the
/// text are recognized. Example: quarrel tokenize -m MODEL --ids "Hello world"
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Print a JSON list of ids instead of one "id -> 'piece'" line per token.
    #[arg(long)]
    pub ids: bool,
    /// Read the text verbatim from stdin (no escape processing).
    #[arg(long)]
    pub stdin: bool,
    /// Do not add BOS/EOS even when the model's metadata asks for them.
    #[arg(long = "no-bos")]
    pub no_bos: bool,
    /// Treat special-token text (e.g. <|im_start|>) as plain text.
    #[arg(long = "no-parse-special")]
    pub no_parse_special: bool,
    /// The text (unless --stdin).
    pub text: Option<String>,
}

pub fn main(a: Args) -> Result<()> {
    let text = match (&a.text, a.stdin) {
        (Some(t), false) => t.clone(),
        (None, true) => {
            let mut b = Vec::new();
            std::io::stdin().read_to_end(&mut b).context("reading stdin")?;
            String::from_utf8(b).context("stdin is not UTF-8")?
        }
        (Some(_), true) => bail!("give either TEXT or --stdin, not both"),
        (None, false) => bail!("nothing to tokenize: give TEXT or --stdin"),
    };
    let path = a.model.model_path()?;
    let g = quarrel_gguf::Gguf::open(&path).with_context(|| format!("opening {}", path.display()))?;
    let tok = quarrel_tokenizer::Tokenizer::from_gguf(&g).with_context(|| format!("tokenizer of {}", path.display()))?;
    let ids = tok.encode(&text, !a.no_bos, !a.no_parse_special);
    if a.ids {
        println!("{}", serde_json::to_string(&ids)?);
    } else {
        for id in ids {
            let piece = String::from_utf8_lossy(&tok.token_to_piece(id, true)).into_owned();
            println!("{id:6} -> '{piece}'");
        }
    }
    Ok(())
}
