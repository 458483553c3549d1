//! `quarrel bench --draft-model M` / `--spec ngram`: decode speed with and without speculative
//! decoding, on real text. llama-bench's tgN feeds random token ids, which no drafter can
//! predict, so these rows generate greedily after a prompt instead, each repetition once
//! without and once with the drafter, and check that both give the same tokens.

use crate::args::{CacheArgs, ContextArgs, DeviceArgs, EngineArgs, KvTypeArg, ModelArg, ModelArgs, TemplateArg};
use crate::common::with_engine;
use crate::speculate::SpecArgs;
use anyhow::{bail, Context, Result};
use quarrel_bench::llama_bench::table;
use quarrel_core::Backend;
use quarrel_engine::{Engine, GenerateParams, SamplingParams, SpecStats};
use quarrel_tokenizer::ChatMessage;
use std::path::Path;

/// The prompts used when --spec-prompt gives none: free text, where a drafter has to guess,
/// and an edit that copies most of its prompt, where drafts are long and mostly right.
pub const PROMPTS: [(&str, &str); 2] = [
    ("story", "Write a short story about a lighthouse keeper who finds a message in a bottle."),
    (
        "code",
        "Rewrite this Python code so that the function is named total_price instead of compute, and print the whole code:

def compute(items, tax_rate):
    subtotal = 0
    for item in items:
        subtotal += item[\"price\"] * item[\"quantity\"]
    tax = subtotal * tax_rate
    total = subtotal + tax
    return round(total, 2)

cart = [{\"price\": 2.5, \"quantity\": 4}, {\"price\": 10.0, \"quantity\": 1}]
print(compute(cart, 0.08))",
    ),
];

/// One prompt and generation length: decode tokens/s of each repetition without and with the
/// drafter, and the drafter's counts over all repetitions.
pub struct SpecRow {
    pub model: String,
    pub threads: usize,
    pub prompt: String,
    pub n_gen: usize,
    pub plain_ts: Vec<f64>,
    pub spec_ts: Vec<f64>,
    pub stats: SpecStats,
    pub same_text: bool,
}

/// What the speculative rows need besides the model and drafter flags.
pub struct SpecBench<'a> {
    pub spec: &'a SpecArgs,
    pub prompts: Vec<(String, String)>,
    pub n_gen: Vec<usize>,
    pub reps: usize,
    pub warmup: bool,
    pub batch: usize,
    pub kv: KvTypeArg,
    pub device: DeviceArgs,
}

impl SpecBench<'_> {
    /// Run every prompt and generation length on `path` with `threads` threads.
    pub fn run(&self, path: &Path, threads: usize) -> Result<Vec<SpecRow>> {
        let model = ModelArgs {
            model: ModelArg { name: Some(path.display().to_string()) },
            template: TemplateArg::default(),
            engine: EngineArgs {
                ctx: ContextArgs { threads, n_ctx: 0 },
                cache: CacheArgs { kv: self.kv.clone(), batch: self.batch, kv_mem: None },
                device: self.device.clone(),
            },
        };
        let mut rows = vec![];
        with_engine!(self.spec.load(&model)?, engine => {
            let Some(mut spec) = engine.take_speculator() else { bail!("no drafter was attached") };
            for (name, text) in &self.prompts {
                let ids = prompt_ids(&engine, text)?;
                for &n in &self.n_gen {
                    if ids.len() + n + spec.opts.draft_max + 1 > engine.n_ctx() {
                        bail!("--spec-prompt {name:?}: {} prompt tokens and {n} generated do not fit the {} context", ids.len(), engine.n_ctx());
                    }
                    let params = GenerateParams { sampling: SamplingParams::greedy(), max_tokens: n, ignore_eos: true, ..Default::default() };
                    eprint!("bench: {name}, tg{n}, {threads} threads, with and without drafts:");
                    if self.warmup {
                        let warm = GenerateParams { max_tokens: n.min(16), ..params.clone() };
                        engine.generate(&ids, &warm, &mut |_| true)?;
                        engine.set_speculator(Some(spec))?;
                        let r = engine.generate(&ids, &warm, &mut |_| true);
                        spec = engine.take_speculator().context("the drafter went missing")?;
                        r?;
                    }
                    let mut row = SpecRow {
                        model: path.display().to_string(),
                        threads,
                        prompt: name.clone(),
                        n_gen: n,
                        plain_ts: vec![],
                        spec_ts: vec![],
                        stats: SpecStats::default(),
                        same_text: true,
                    };
                    for _ in 0..self.reps {
                        let plain = engine.generate(&ids, &params, &mut |_| true)?;
                        engine.set_speculator(Some(spec))?;
                        let fast = engine.generate(&ids, &params, &mut |_| true);
                        spec = engine.take_speculator().context("the drafter went missing")?;
                        let fast = fast?;
                        row.same_text &= plain.tokens == fast.tokens;
                        row.plain_ts.push(plain.timings.gen_tps());
                        row.spec_ts.push(fast.timings.gen_tps());
                        let s = &fast.timings.spec;
                        row.stats.drafted += s.drafted;
                        row.stats.accepted += s.accepted;
                        row.stats.target_steps += s.target_steps;
                        eprint!(" {:.1}/{:.1}", plain.timings.gen_tps(), fast.timings.gen_tps());
                    }
                    eprintln!(" t/s");
                    rows.push(row);
                }
            }
        });
        Ok(rows)
    }
}

/// The prompt's ids: wrapped as a user message when the model has a chat template.
fn prompt_ids<B: Backend>(engine: &Engine<B>, text: &str) -> Result<Vec<u32>> {
    Ok(if engine.tokenizer.chat_template().is_some() {
        engine.tokenizer.encode_chat(&[ChatMessage::new("user", text)], true).context("applying the chat template")?
    } else {
        engine.tokenize(text, true)
    })
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// The markdown table of `rows`: mean decode t/s without and with drafts, their ratio, the
/// share of drafted tokens accepted and tokens per forward pass of the model.
pub fn markdown(rows: &[SpecRow]) -> String {
    let lines: Vec<[String; 9]> = rows
        .iter()
        .map(|r| {
            let (a, b) = (mean(&r.plain_ts), mean(&r.spec_ts));
            let steps = r.stats.target_steps.max(1) as f64;
            // each step emits its accepted drafts plus the model's own token
            let per_step = (r.stats.accepted as f64 + steps) / steps;
            [
                r.model.clone(),
                r.threads.to_string(),
                r.prompt.clone(),
                format!("tg{}", r.n_gen),
                format!("{a:.2}"),
                format!("{b:.2}"),
                format!("{:.2}", b / a.max(1e-9)),
                format!("{:.0}% ({:.2}/step)", 100.0 * r.stats.acceptance(), per_step),
                if r.same_text { "yes".into() } else { "NO".into() },
            ]
        })
        .collect();
    table(
        &["model", "threads", "prompt", "test", "t/s", "t/s drafted", "speed-up", "accepted", "same text"],
        &[false, true, false, false, true, true, true, true, false],
        &lines,
    )
}
