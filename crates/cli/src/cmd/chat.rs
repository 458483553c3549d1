//! `quarrel chat`: an interactive conversation using the model's chat template.

use crate::args::GenerationArgs;
use crate::common::{stream_to_stdout, with_engine};
use anyhow::{Context, Result};
use quarrel_tokenizer::ChatMessage;
use std::io::{BufRead, Write};

/// Chat interactively with a model, using its chat template.
///
/// Type a message and press Enter; /reset clears the history, /exit quits (or Ctrl-D).
/// The conversation so far is sent with every turn.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub generation: GenerationArgs,
    /// System prompt.
    #[arg(long)]
    pub system: Option<String>,
    /// Most tokens per answer.
    #[arg(short = 'n', long = "n-predict", default_value_t = 512)]
    pub n_predict: usize,
}

pub fn main(a: Args) -> Result<()> {
    with_engine!(a.generation.model.engine()?, engine => {
        let mut history: Vec<ChatMessage> = vec![];
        if let Some(s) = &a.system {
            history.push(ChatMessage::new("system", s));
        }
        let params = a.generation.sample.params(a.n_predict);
        let stdin = std::io::stdin();
        let mut lines = stdin.lock().lines();
        eprintln!("chat ready: /reset clears the history, /exit or Ctrl-D quits");
        loop {
            eprint!("> ");
            let _ = std::io::stderr().flush();
            let Some(line) = lines.next() else { break };
            let line = line.context("reading stdin")?;
            let msg = line.trim();
            match msg {
                "" => continue,
                "/exit" | "/quit" => break,
                "/reset" => {
                    history.retain(|m| m.role == "system");
                    eprintln!("(history cleared)");
                    continue;
                }
                _ => {}
            }
            history.push(ChatMessage::new("user", msg));
            // what the user typed stays text, even where it spells a control token
            let ids = engine.tokenizer.encode_chat(&history, true)?;
            if ids.len() + 1 >= engine.n_ctx() {
                eprintln!("(the conversation no longer fits the context of {} tokens: use /reset)", engine.n_ctx());
                history.pop();
                continue;
            }
            let c = stream_to_stdout(&mut engine, &ids, &params)?;
            eprintln!("({} tokens, {:.1} t/s)", c.timings.gen_tokens, c.timings.gen_tps());
            history.push(ChatMessage::new("assistant", c.text.trim()));
        }
        Ok(())
    })
}
