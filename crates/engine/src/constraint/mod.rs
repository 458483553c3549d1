//! Constrained decoding: a per-sequence matcher (llguidance) that says which tokens may come
//! next, so that the output follows a JSON schema, JSON in general, a Lark or GBNF grammar,
//! or a regular expression.
//!
//! ```text
//!  ConstraintSpec ─ConstraintCompiler::compile─► Constraint (one per sequence)
//!                   (token table built once per tokenizer: vocab.rs)
//!  decode::forward_picks ─► Constraint::mask (host threads, beside the forward) ─► TokenMask
//!  ─► Backend::sample_rows: logits of disallowed tokens at -inf before the sampling chain
//!  SeqDecoder::accept(id) ─► Constraint::accept(id) ─► grammar complete: the sequence ends
//! ```
//!
//! | module  | responsibility |
//! |---------|----------------|
//! | `vocab` | llguidance's token table from Quarrel's tokenizer (special tokens excluded) |
//! | `gbnf`  | llama.cpp GBNF grammars rewritten in llguidance's Lark dialect |

mod gbnf;
mod vocab;

pub use gbnf::gbnf_to_lark;

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
pub use quarrel_core::TokenMask;
use quarrel_tokenizer::Tokenizer;
use serde_json::{json, Value};
use std::fmt;
use std::sync::Arc;

/// What the output must follow.
#[derive(Clone, Debug, PartialEq)]
pub enum ConstraintSpec {
    /// A JSON schema (draft 2020-12 subset as llguidance supports it).
    JsonSchema(Value),
    /// Any JSON object (OpenAI `json_object`, ollama `"json"`).
    JsonObject,
    /// A grammar in llguidance's Lark dialect.
    Lark(String),
    /// A llama.cpp GBNF grammar.
    Gbnf(String),
    /// A regular expression (Rust `regex` syntax) the whole output matches.
    Regex(String),
}

/// JSON layout the schema grammars produce: one space after `,` and `:` and no other
/// whitespace, which keeps small models from padding the output with blank lines.
fn json_layout() -> Value {
    json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
}

impl ConstraintSpec {
    fn grammar(&self) -> Result<TopLevelGrammar, String> {
        Ok(match self {
            ConstraintSpec::JsonSchema(schema) => {
                let mut schema = schema.clone();
                match &mut schema {
                    Value::Object(m) => {
                        m.entry("x-guidance").or_insert_with(json_layout);
                    }
                    Value::Bool(_) => {}
                    _ => return Err("a JSON schema must be an object or a boolean".into()),
                }
                TopLevelGrammar::from_json_schema(schema)
            }
            ConstraintSpec::JsonObject => {
                let mut s = json!({"type": "object"});
                s["x-guidance"] = json_layout();
                TopLevelGrammar::from_json_schema(s)
            }
            ConstraintSpec::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
            ConstraintSpec::Gbnf(g) => TopLevelGrammar::from_lark(gbnf_to_lark(g)?),
            ConstraintSpec::Regex(r) => {
                // checked here: llguidance's own message for a bad regex is less direct
                regex_syntax::Parser::new().parse(r).map_err(|e| format!("invalid regex: {e}"))?;
                TopLevelGrammar::from_regex(r)
            }
        })
    }
}

/// Compiles constraints for one tokenizer; the token table is built once and shared.
pub struct ConstraintCompiler {
    factory: ParserFactory,
}

impl ConstraintCompiler {
    pub fn new(tok: &Tokenizer) -> Result<ConstraintCompiler, String> {
        let env = vocab::tok_env(tok)?;
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| format!("constraint token table: {e}"))?;
        // errors come back as values; nothing goes to stderr
        factory.quiet();
        Ok(ConstraintCompiler { factory })
    }

    /// A fresh matcher for `spec`, or a message saying what is wrong with it.
    pub fn compile(&self, spec: &ConstraintSpec) -> Result<Constraint, String> {
        let grammar = spec.grammar()?;
        let parser = self.factory.create_parser(grammar).map_err(|e| e.to_string())?;
        let mut matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(e);
        }
        // a grammar that admits nothing fails on its first mask: report it now
        let first = matcher.compute_mask().map_err(|e| e.to_string())?;
        if first.is_zero() {
            return Err("the grammar admits no output".into());
        }
        let trie = self.factory.tok_env().tok_trie();
        Ok(Constraint { matcher, first: Some(first), eog: trie.eos_token_set() })
    }
}

/// One sequence's matcher: the tokens allowed next, advanced on each accepted token.
pub struct Constraint {
    matcher: Matcher,
    /// The mask `compile` computed, used for the first pick.
    first: Option<toktrie::SimpleVob>,
    /// The end-of-generation tokens (what a failed matcher allows).
    eog: toktrie::SimpleVob,
}

impl fmt::Debug for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Constraint").field("stopped", &self.matcher.is_stopped()).finish()
    }
}

impl Constraint {
    /// The tokens allowed next (end-of-generation tokens once the grammar may end; only
    /// those once it must). An error in the matcher allows only end-of-generation tokens,
    /// which ends the sequence.
    pub fn mask(&mut self) -> TokenMask {
        let v = match self.first.take() {
            Some(v) => Ok(v),
            None => self.matcher.compute_mask_or_eos(),
        };
        let v = v.unwrap_or_else(|_| self.eog.clone());
        TokenMask::from_words(v.as_slice().to_vec())
    }

    /// Advance past the accepted token `id`. Err: `id` breaks the grammar (a pick that did
    /// not go through the mask).
    pub fn accept(&mut self, id: u32) -> Result<(), String> {
        self.first = None;
        self.matcher.consume_token(id).map_err(|e| e.to_string())
    }

    /// The grammar is complete and admits nothing more.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }
}

/// The compiler for `tok`, shared by the requests of one engine.
pub type SharedCompiler = Arc<ConstraintCompiler>;

#[cfg(test)]
mod tests;
