//! Text embeddings on top of the service: task prefixes that embedding models were trained
//! with (nomic-embed's `search_document:` / `search_query:`, e5's `passage:` / `query:`, ...),
//! chosen from the model's metadata or forced by the caller, then pooled (mean / last / CLS)
//! and L2-normalized vectors from the scheduler, which packs short texts several per forward.
//!
//! ```text
//!  texts ─► prefix (task + model family | --prefix) ─► EngineHandle::embed ─► Vec<Vec<f32>>
//! ```

use crate::service::{Embeddings, EngineHandle, ModelSummary, Pooling, Prompt, ServiceError};

/// What the text is for: retrieval models embed documents and queries differently.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EmbedTask {
    /// Text stored in the index.
    #[default]
    Document,
    /// Text searched with.
    Query,
}

impl std::str::FromStr for EmbedTask {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "document" | "doc" | "passage" => Ok(EmbedTask::Document),
            "query" => Ok(EmbedTask::Query),
            _ => Err(format!("unknown embedding task {s:?} (expected document or query)")),
        }
    }
}

/// Where the text prefix comes from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum PrefixMode {
    /// The model family's documented prefix for the task, if the metadata names a known family.
    #[default]
    Auto,
    /// Texts are embedded as given.
    Off,
    /// This prefix, whatever the model.
    Fixed(String),
}

/// The prefixes a model family was trained with (empty = none for that task).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskPrefixes {
    pub document: &'static str,
    pub query: &'static str,
}

/// Families recognised by a substring of `general.name` or `general.architecture`
/// (lower-cased), with the prefixes from their model cards.
const FAMILIES: &[(&str, TaskPrefixes)] = &[
    ("nomic-embed", TaskPrefixes { document: "search_document: ", query: "search_query: " }),
    ("nomic-bert", TaskPrefixes { document: "search_document: ", query: "search_query: " }),
    ("e5-", TaskPrefixes { document: "passage: ", query: "query: " }),
    ("mxbai-embed", TaskPrefixes { document: "", query: "Represent this sentence for searching relevant passages: " }),
    ("bge-", TaskPrefixes { document: "", query: "Represent this sentence for searching relevant passages: " }),
];

/// The task prefixes the model's metadata asks for, if it names a known family.
pub fn model_prefixes(info: &ModelSummary) -> Option<TaskPrefixes> {
    let name = info.name.to_ascii_lowercase();
    let arch = info.arch.to_ascii_lowercase();
    FAMILIES.iter().find(|(k, _)| name.contains(k) || arch.contains(k)).map(|(_, p)| *p)
}

/// The prefix to put in front of every text (`None`: none).
pub fn resolve_prefix(info: &ModelSummary, task: EmbedTask, mode: &PrefixMode) -> Option<String> {
    let p = match mode {
        PrefixMode::Off => return None,
        PrefixMode::Fixed(p) => p.clone(),
        PrefixMode::Auto => {
            let f = model_prefixes(info)?;
            match task {
                EmbedTask::Document => f.document,
                EmbedTask::Query => f.query,
            }
            .to_string()
        }
    };
    (!p.is_empty()).then_some(p)
}

/// How to embed a list of texts.
#[derive(Clone, Debug, Default)]
pub struct EmbedOptions {
    /// `None`: the model's `pooling_type` (mean when it has none).
    pub pooling: Option<Pooling>,
    pub normalize: bool,
    pub task: EmbedTask,
    pub prefix: PrefixMode,
    /// Matryoshka truncation to this many values (normalized again when `normalize`).
    pub dimensions: Option<usize>,
}

impl EmbedOptions {
    /// The texts as the engine will see them (prefix applied).
    pub fn prompts(&self, info: &ModelSummary, texts: &[String]) -> Vec<Prompt> {
        let prefix = resolve_prefix(info, self.task, &self.prefix);
        texts
            .iter()
            .map(|t| {
                Prompt::Text(match &prefix {
                    Some(p) => format!("{p}{t}"),
                    None => t.clone(),
                })
            })
            .collect()
    }

    pub fn pooling_for(&self, info: &ModelSummary) -> Pooling {
        self.pooling.unwrap_or(info.pooling)
    }

    /// `e` cut to `dimensions`, if set.
    fn truncate(&self, e: Embeddings) -> Result<Embeddings, ServiceError> {
        match self.dimensions {
            Some(d) => e.truncated(d, self.normalize),
            None => Ok(e),
        }
    }
}

/// Embed `texts` through the scheduler (one command; short texts share forwards), into one
/// row-major buffer.
pub async fn embed_texts(h: &EngineHandle, texts: &[String], opts: &EmbedOptions) -> Result<Embeddings, ServiceError> {
    let info = h.info();
    let e = h.embed_matrix(opts.prompts(info, texts), opts.pooling_for(info), opts.normalize).await?;
    opts.truncate(e)
}

/// Blocking variant of [`embed_texts`] (outside async code).
pub fn embed_texts_blocking(h: &EngineHandle, texts: &[String], opts: &EmbedOptions) -> Result<Embeddings, ServiceError> {
    let info = h.info();
    let e = h.embed_matrix_blocking(opts.prompts(info, texts), opts.pooling_for(info), opts.normalize)?;
    opts.truncate(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str, arch: &str) -> ModelSummary {
        ModelSummary {
            name: name.into(),
            path: None,
            arch: arch.into(),
            n_ctx: 0,
            n_ctx_train: 0,
            n_vocab: 0,
            n_embd: 0,
            n_layer: 0,
            n_head: 0,
            n_kv_head: 0,
            n_params: 0,
            file_type: String::new(),
            size_bytes: 0,
            chat_template: None,
            pooling: Pooling::Mean,
            n_classes: 0,
            kv_type: String::new(),
            backend: String::new(),
        }
    }

    #[test]
    fn nomic_gets_task_prefixes_from_metadata() {
        let m = info("nomic-embed-text-v1.5", "nomic-bert");
        assert_eq!(resolve_prefix(&m, EmbedTask::Document, &PrefixMode::Auto).as_deref(), Some("search_document: "));
        assert_eq!(resolve_prefix(&m, EmbedTask::Query, &PrefixMode::Auto).as_deref(), Some("search_query: "));
        assert_eq!(resolve_prefix(&m, EmbedTask::Query, &PrefixMode::Off), None);
        let o = EmbedOptions { task: EmbedTask::Query, ..Default::default() };
        match &o.prompts(&m, &["hi".into()])[0] {
            Prompt::Text(t) => assert_eq!(t, "search_query: hi"),
            p => panic!("{p:?}"),
        }
    }

    #[test]
    fn unknown_models_get_no_prefix_unless_forced() {
        let m = info("SmolLM2 135M Instruct", "llama");
        assert_eq!(resolve_prefix(&m, EmbedTask::Document, &PrefixMode::Auto), None);
        assert_eq!(resolve_prefix(&m, EmbedTask::Query, &PrefixMode::Fixed("q: ".into())).as_deref(), Some("q: "));
        assert_eq!(resolve_prefix(&m, EmbedTask::Query, &PrefixMode::Fixed(String::new())), None);
        let e5 = info("multilingual-e5-small", "bert");
        assert_eq!(resolve_prefix(&e5, EmbedTask::Document, &PrefixMode::Auto).as_deref(), Some("passage: "));
        let bge = info("bge-small-en-v1.5", "bert");
        assert_eq!(resolve_prefix(&bge, EmbedTask::Document, &PrefixMode::Auto), None);
        assert!("nope".parse::<EmbedTask>().is_err());
        assert_eq!("query".parse::<EmbedTask>(), Ok(EmbedTask::Query));
    }
}
