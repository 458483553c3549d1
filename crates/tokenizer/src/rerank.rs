//! The input of a reranking (cross-encoder) model: one query and one document as a single
//! token sequence, built as llama.cpp's server builds it. A file with a
//! `tokenizer.chat_template.rerank` gets that template with `{query}` and `{document}`
//! substituted (special tokens parsed); otherwise BOS, the query, EOS, SEP, the document and
//! EOS, each special token where the vocabulary's `add_*` flags ask for it (BERT: `[CLS] query
//! [SEP] document`). EOS falls back to SEP in vocabularies without one.

use crate::Tokenizer;

impl Tokenizer {
    /// The tokens a reranker scores for `query` against `document`.
    pub fn rerank_pair(&self, query: &str, document: &str) -> Vec<u32> {
        if let Some(t) = &self.rerank_template {
            let prompt = t.replace("{query}", query).replace("{document}", document);
            return self.encode(&prompt, false, true);
        }
        let v = &self.vocab;
        let eos = v.ids.eos.or(v.ids.sep);
        let mut out = Vec::new();
        if v.add_bos {
            out.extend(v.ids.bos);
        }
        out.extend(self.encode(query, false, false));
        if v.add_eos {
            out.extend(eos);
        }
        if v.add_sep {
            out.extend(v.ids.sep);
        }
        out.extend(self.encode(document, false, false));
        if v.add_eos {
            out.extend(eos);
        }
        out
    }
}
