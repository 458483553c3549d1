//! `--draft-model`, `--spec ngram` and their limits: speculative decoding for `run` and `chat`.

use crate::args::{ModelArgs, NumericsArg, TemplateArg};
use crate::common::{with_engine, AnyEngine};
use anyhow::{bail, Context, Result};
use quarrel_engine::{Drafter, EngineOptions, ModelDrafter, NgramDrafter, SpecOptions, SpecStats, Speculator};
use quarrel_tokenizer::Tokenizer;

/// Speculative decoding: a drafter proposes tokens, the model checks them in one forward
/// pass; the output is the model's own (same text, greedy or seeded sampling).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct SpecArgs {
    /// A smaller model with the same vocabulary that drafts tokens for the model to check
    /// (a .gguf path or a name, as -m).
    #[arg(long = "draft-model", value_name = "MODEL", env = "QUARREL_DRAFT_MODEL")]
    pub draft_model: Option<String>,
    /// Speculation without a draft model: `ngram` drafts what followed the latest earlier
    /// occurrence of the last few tokens (prompt lookup: edits, code, quotes).
    #[arg(long = "spec", value_name = "ngram", value_parser = ["ngram"], env = "QUARREL_SPEC")]
    pub spec: Option<String>,
    /// Most tokens drafted per step.
    #[arg(long = "draft-max", default_value_t = 8, env = "QUARREL_DRAFT_MAX")]
    pub draft_max: usize,
    /// Drafts shorter than this are not checked.
    #[arg(long = "draft-min", default_value_t = 0, env = "QUARREL_DRAFT_MIN")]
    pub draft_min: usize,
    /// The draft model stops at a token it gives less than this probability (0: drafts
    /// --draft-max tokens, or as many as its acceptance earns).
    #[arg(long = "draft-p-min", default_value_t = 0.0, env = "QUARREL_DRAFT_P_MIN")]
    pub draft_p_min: f32,
    /// Device of the draft model (default: the model's --device).
    #[arg(long = "device-draft", value_name = "DEVICE", env = "QUARREL_DEVICE_DRAFT")]
    pub device_draft: Option<String>,
}

impl SpecArgs {
    pub fn enabled(&self) -> bool {
        self.draft_model.is_some() || self.spec.is_some()
    }

    fn options(&self) -> Result<SpecOptions> {
        if self.draft_max == 0 {
            bail!("--draft-max must be at least 1");
        }
        if !(0.0..=1.0).contains(&self.draft_p_min) {
            bail!("--draft-p-min {} is not a probability", self.draft_p_min);
        }
        Ok(SpecOptions { draft_max: self.draft_max, draft_min: self.draft_min, p_min: self.draft_p_min, step_budget: 0 })
    }

    /// Load `model` with the drafter these flags ask for attached. A speculating model on a
    /// GPU computes with batch-invariant numerics unless --numerics says otherwise, so that
    /// checking a draft gives the logits a one-token step would (the same text as without
    /// speculation).
    pub fn load(&self, model: &ModelArgs) -> Result<AnyEngine> {
        self.load_with(model, false, |_| {})
    }

    /// `load` with the engine options of both models adjusted by `f` (sequence count, ...).
    /// `serving`: a server's model keeps its default numerics (invariant numerics cost a large
    /// batch's decode steps much more than one sequence's), and a drafter that does not fit it
    /// (another vocabulary, a recurrent model) is a warning: the server loads many models.
    pub fn load_with(&self, model: &ModelArgs, serving: bool, f: impl Fn(&mut EngineOptions)) -> Result<AnyEngine> {
        if self.draft_model.is_some() && self.spec.is_some() {
            bail!("--draft-model and --spec ngram are two drafters: choose one");
        }
        if !self.enabled() {
            return model.engine_with(f);
        }
        let opts = self.options()?;
        let mut model = model.clone();
        if !serving && model.engine.device.numerics == NumericsArg::Auto {
            model.engine.device.numerics = NumericsArg::Invariant;
        }
        let mut engine = model.engine_with(&f)?;
        let drafter: Result<Box<dyn Drafter>> = match &self.draft_model {
            None => Ok(Box::new(NgramDrafter::default())),
            Some(name) => (|| {
                let mut dm = model.clone();
                dm.model.name = Some(name.clone());
                dm.template = TemplateArg::default();
                if let Some(d) = &self.device_draft {
                    dm.engine.device.device = d.clone();
                }
                dm.engine.ctx.n_ctx = with_engine!(ref &engine, e => { e.n_ctx() });
                let tok = with_engine!(ref &engine, e => { e.tokenizer.clone() });
                let draft = dm.engine_beside(&f, Some(&engine)).context("loading the draft model")?;
                model_drafter(draft, &tok, opts.p_min)
            })(),
        };
        let attached = drafter.and_then(|drafter| {
            let what = drafter.describe();
            with_engine!(ref &mut engine, e => {
                e.set_speculator(Some(Speculator { drafter, opts })).context("speculative decoding")?;
            });
            Ok(what)
        });
        let what = match attached {
            Ok(w) => w,
            Err(e) if serving => {
                tracing::warn!(error = %format!("{e:#}"), "serving without speculative decoding");
                return Ok(engine);
            }
            Err(e) => return Err(e),
        };
        eprintln!("speculative decoding: {what} drafts up to {} tokens a step", opts.draft_max);
        Ok(engine)
    }
}

fn model_drafter(draft: AnyEngine, target: &Tokenizer, p_min: f32) -> Result<Box<dyn Drafter>> {
    Ok(match draft {
        AnyEngine::Cpu(e) => Box::new(ModelDrafter::new(e, target, p_min)?),
        AnyEngine::Cuda(e) => Box::new(ModelDrafter::new(e, target, p_min)?),
    })
}

/// The drafts' line of a completion's timings ("" without speculation).
pub fn summary(s: &SpecStats, tokens: usize) -> String {
    if s.target_steps == 0 {
        return String::new();
    }
    format!(
        " | drafts: {}/{} accepted ({:.0}%), {:.2} tokens a step",
        s.accepted,
        s.drafted,
        100.0 * s.acceptance(),
        tokens.saturating_sub(1) as f64 / s.target_steps as f64
    )
}
