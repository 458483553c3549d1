//! `quarrel chat`: an interactive conversation using the model's chat template. Reasoning
//! (`<think>` blocks, GPT-OSS's analysis channel) streams to stderr, the answer to stdout, and
//! the history keeps them apart as the template expects.

use crate::args::GenerationArgs;
use crate::common::with_engine;
use anyhow::{Context, Result};
use quarrel_core::Backend;
use quarrel_engine::{Completion, Engine, GenerateParams};
use quarrel_server::tools::{ChatPlan, Piece, Reply, ToolFormat};
use quarrel_tokenizer::ChatMessage;
use std::io::{BufRead, IsTerminal, Write};

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
    with_engine!(a.generation.engine()?, engine => {
        let mut history: Vec<ChatMessage> = vec![];
        if let Some(s) = &a.system {
            history.push(ChatMessage::new("system", s));
        }
        let params = a.generation.sample.params(a.n_predict);
        let template = engine.tokenizer.chat_template();
        let plan = ChatPlan {
            tools: None,
            think: template.is_some_and(|t| t.contains("<think>")),
            harmony: ToolFormat::detect(template) == ToolFormat::Harmony,
        };
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
            let (c, reply) = answer(&mut engine, &ids, &params, &plan)?;
            eprintln!("({} tokens, {:.1} t/s{})", c.timings.gen_tokens, c.timings.gen_tps(), crate::speculate::summary(&c.timings.spec, c.timings.gen_tokens));
            let mut m = ChatMessage::new("assistant", reply.content.trim());
            if !reply.reasoning.is_empty() {
                m.reasoning_content = Some(reply.reasoning.trim().to_string());
            }
            history.push(m);
        }
        Ok(())
    })
}

/// Generate the answer to `ids`: the answer streamed to stdout, the reasoning to stderr (dimmed
/// on a terminal), as they come.
fn answer<B: Backend>(engine: &mut Engine<B>, ids: &[u32], params: &GenerateParams, plan: &ChatPlan) -> Result<(Completion, Reply)> {
    let (mut out, dim) = (std::io::stdout().lock(), std::io::stderr().is_terminal());
    let mut show = |p: &Piece| match p {
        Piece::Content(t) => {
            let _ = out.write_all(t.as_bytes());
            let _ = out.flush();
        }
        Piece::Reasoning(t) if dim => eprint!("\x1b[2m{t}\x1b[0m"),
        Piece::Reasoning(t) => eprint!("{t}"),
    };
    let mut split = plan.splitter();
    let mut pieces = vec![];
    let c = engine.generate(ids, params, &mut |ev| {
        for p in split.push(ev.text) {
            show(&p);
            pieces.push(p);
        }
        true
    })?;
    let end = split.finish();
    end.tail.iter().for_each(&mut show);
    println!();
    Ok((c, Reply::gather(pieces, end)))
}
