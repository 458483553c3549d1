//! `quarrel run`: one completion streamed to stdout; timings on stderr.

use crate::args::GenerationArgs;
use crate::common::{stream_to_stdout, with_engine};
use anyhow::{Context, Result};
use quarrel_tokenizer::ChatMessage;
use std::io::Read;

/// Complete a prompt. stdout carries only the generated text.
///
/// Instruct models (those with a chat template) get the prompt wrapped as a user message
/// unless --raw is given. Example: quarrel run -p "Why is the sky blue?" -n 64
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub generation: GenerationArgs,
    /// The prompt (read from stdin when absent).
    #[arg(short = 'p', long = "prompt")]
    pub prompt: Option<String>,
    /// Number of tokens to generate at most.
    #[arg(short = 'n', long = "n-predict", default_value_t = 256)]
    pub n_predict: usize,
    /// Use the prompt as is: no chat template.
    #[arg(long)]
    pub raw: bool,
    /// System prompt (chat template only).
    #[arg(long)]
    pub system: Option<String>,
}

pub fn main(a: Args) -> Result<()> {
    let prompt = match a.prompt {
        Some(p) => p,
        None => {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s).context("reading the prompt from stdin")?;
            s
        }
    };
    with_engine!(a.generation.engine()?, engine => {
        let templated = !a.raw && engine.tokenizer.chat_template().is_some();
        let ids = if templated {
            let mut msgs = vec![];
            if let Some(s) = &a.system {
                msgs.push(ChatMessage::new("system", s));
            }
            msgs.push(ChatMessage::new("user", &prompt));
            engine.tokenizer.encode_chat(&msgs, true).context("applying the chat template")?
        } else {
            engine.tokenize(&prompt, true)
        };
        let params = a.generation.sample.params(a.n_predict);
        let c = stream_to_stdout(&mut engine, &ids, &params)?;
        let t = &c.timings;
        eprintln!(
            "\nprompt: {} tokens in {:.1} ms ({:.1} t/s) | generated: {} tokens, {:.1} t/s | first token after {:.1} ms | finish: {}{}",
            t.prompt_tokens,
            t.prompt_time.as_secs_f64() * 1e3,
            t.prompt_tps(),
            t.gen_tokens,
            t.gen_tps(),
            t.time_to_first_token.as_secs_f64() * 1e3,
            c.finish_reason.as_str(),
            crate::speculate::summary(&t.spec, t.gen_tokens)
        );
        Ok(())
    })
}
