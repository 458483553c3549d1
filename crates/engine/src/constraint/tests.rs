//! Constrained random walks over the synthetic SPM vocabulary (byte tokens, pieces, control
//! tokens): whatever random logits say, the masked picks spell text the grammar accepts.

use super::*;
use quarrel_tokenizer::Tokenizer;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::OnceLock;

fn tokenizer() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        quarrel_synth::write_tiny(&path, quarrel_synth::Ftype::F32, 1).unwrap();
        Tokenizer::from_gguf(&quarrel_gguf::Gguf::open(&path).unwrap()).unwrap()
    })
}

fn compiler() -> &'static ConstraintCompiler {
    static C: OnceLock<ConstraintCompiler> = OnceLock::new();
    C.get_or_init(|| ConstraintCompiler::new(tokenizer()).unwrap())
}

/// Decode under `spec` with random logits (seeded), picking the best allowed token each
/// step: the text, and whether the walk ended by the grammar (not by the step limit).
fn walk(spec: &ConstraintSpec, seed: u64, max_steps: usize) -> (String, bool) {
    let tok = tokenizer();
    let mut c = compiler().compile(spec).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut bytes = vec![];
    for _ in 0..max_steps {
        let mask = c.mask();
        let mut logits: Vec<f32> = (0..tok.n_vocab()).map(|_| rng.gen_range(-4.0..4.0)).collect();
        mask.apply(&mut logits);
        let id = crate::sampler::argmax(&logits);
        assert!(mask.allows(id), "the pick is in the mask");
        if tok.is_eog(id) {
            return (String::from_utf8(bytes).unwrap(), true);
        }
        bytes.extend(tok.token_to_piece(id, false));
        c.accept(id).unwrap();
        if c.is_finished() {
            return (String::from_utf8(bytes).unwrap(), true);
        }
    }
    (String::from_utf8_lossy(&bytes).into_owned(), false)
}

#[test]
fn json_schema_walks_validate() {
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "age": {"type": "integer", "minimum": 18, "maximum": 99},
            "tier": {"enum": ["gold", "silver"]},
            "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{1,3}$"}, "minItems": 1, "maxItems": 3},
            "home": {"type": "object", "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["zip"], "additionalProperties": false},
        },
        "required": ["name", "age", "tier", "tags", "home"],
        "additionalProperties": false,
    });
    let spec = ConstraintSpec::JsonSchema(schema);
    for seed in 0..12 {
        let (text, done) = walk(&spec, seed, 400);
        assert!(done, "seed {seed}: the walk did not end: {text:?}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("seed {seed}: {text:?}: {e}"));
        assert!(v["name"].as_str().unwrap().chars().count() <= 6, "{text}");
        assert!((18..=99).contains(&v["age"].as_i64().unwrap()), "{text}");
        assert!(["gold", "silver"].contains(&v["tier"].as_str().unwrap()), "{text}");
        let tags = v["tags"].as_array().unwrap();
        assert!((1..=3).contains(&tags.len()), "{text}");
        assert!(
            tags.iter().all(|t| {
                let t = t.as_str().unwrap();
                (1..=3).contains(&t.len()) && t.bytes().all(|b| b.is_ascii_lowercase())
            }),
            "{text}"
        );
        let zip = v["home"]["zip"].as_str().unwrap();
        assert!(zip.len() == 5 && zip.bytes().all(|b| b.is_ascii_digit()), "{text}");
        assert_eq!(v.as_object().unwrap().len(), 5, "{text}");
        assert!(text.contains("\": "), "the separators are the compact layout: {text}");
    }
}

#[test]
fn json_object_walks_parse_as_objects() {
    for seed in 0..6 {
        let (text, done) = walk(&ConstraintSpec::JsonObject, seed, 3000);
        if done {
            // syntax only: JSON allows numbers (845E1584) that no f64 holds
            serde_json::from_str::<serde::de::IgnoredAny>(&text).unwrap_or_else(|e| panic!("seed {seed}: {text:?}: {e}"));
            assert!(text.starts_with('{') && text.ends_with('}'), "{text}");
        } else {
            assert!(text.starts_with('{'), "{text}");
        }
    }
}

#[test]
fn regex_walks_match() {
    let spec = ConstraintSpec::Regex("(ab|cd)[x-z]{2,4}-[0-9]{1,3}".into());
    for seed in 0..10 {
        let (text, done) = walk(&spec, seed, 100);
        assert!(done, "{text}");
        let (head, num) = text.split_once('-').unwrap();
        assert!(head.starts_with("ab") || head.starts_with("cd"), "{text}");
        assert!((2..=4).contains(&head[2..].len()) && head[2..].bytes().all(|b| (b'x'..=b'z').contains(&b)), "{text}");
        assert!((1..=3).contains(&num.len()) && num.bytes().all(|b| b.is_ascii_digit()), "{text}");
    }
}

/// A GBNF grammar with what llama.cpp's samples use: camelCase names, rules over several
/// lines, comments, escapes in strings and classes, empty alternatives, bounded repeats.
const LIST_GBNF: &str = r#"
# a bracketed list of words or quoted strings
root ::= "[" ws item ("," ws item){0,3} "]"
item ::=
    wordItem
  | "\"" [^"\\\x00-\x1F\x7F]{0,4} "\""   # a short string
wordItem ::= [a-c] [a-c0-9_]{0,2}
ws ::= | " "
"#;

#[test]
fn gbnf_walks_parse() {
    let spec = ConstraintSpec::Gbnf(LIST_GBNF.into());
    for seed in 0..12 {
        let (text, done) = walk(&spec, seed, 200);
        assert!(done, "{text}");
        let inner = text.strip_prefix('[').and_then(|t| t.strip_suffix(']')).unwrap_or_else(|| panic!("{text}"));
        let items: Vec<&str> = inner.split(',').collect();
        assert!((1..=4).contains(&items.len()), "{text}");
        for it in items {
            let it = it.strip_prefix(' ').unwrap_or(it);
            let ok = if let Some(s) = it.strip_prefix('"') {
                s.strip_suffix('"').is_some_and(|s| s.chars().count() <= 4 && !s.contains(['"', '\\']))
            } else {
                let b = it.as_bytes();
                !b.is_empty()
                    && b.len() <= 3
                    && (b'a'..=b'c').contains(&b[0])
                    && b[1..].iter().all(|&c| matches!(c, b'a'..=b'c' | b'0'..=b'9' | b'_'))
            };
            assert!(ok, "item {it:?} of {text:?}");
        }
    }
}

#[test]
fn gbnf_names_and_empty_alternatives_convert() {
    let lark = gbnf_to_lark("root ::= dataType ( | \"x\" )\ndataType ::= \"int\" | \ndata_type ::= [\\u2028-\\u2029.]").unwrap();
    assert!(lark.contains("g-root: g-data_type ( \"\" | \"x\" )"), "{lark}");
    assert!(lark.contains("g-data_type: \"int\" | \"\""), "{lark}");
    assert!(lark.contains("g-data__type: /[\\x{2028}-\\x{2029}\\x{2E}]/"), "{lark}");
    assert!(lark.ends_with("start: g-root\n"), "{lark}");
}

#[test]
fn bad_specs_are_errors_with_reasons() {
    let c = compiler();
    let bad = [
        (ConstraintSpec::JsonSchema(serde_json::json!({"type": "nope"})), ""),
        (ConstraintSpec::JsonSchema(serde_json::json!(3)), "object or a boolean"),
        (ConstraintSpec::JsonSchema(serde_json::json!({"type": "integer", "minimum": 5, "maximum": 1})), ""),
        (ConstraintSpec::Gbnf("root ::= item".into()), "item is used but not defined"),
        (ConstraintSpec::Gbnf("root ::= \"abc".into()), "unterminated string"),
        (ConstraintSpec::Gbnf("item ::= \"a\"".into()), "no `root` rule"),
        (ConstraintSpec::Gbnf("root ::= [z-a]".into()), "reversed"),
        (ConstraintSpec::Gbnf("root ::= (\"a\"".into()), "unbalanced"),
        (ConstraintSpec::Lark("start: foo".into()), ""),
        (ConstraintSpec::Regex("(ab".into()), "invalid regex"),
    ];
    for (spec, want) in bad {
        let e = c.compile(&spec).expect_err(&format!("{spec:?} compiles"));
        assert!(!e.is_empty() && e.contains(want), "{spec:?}: {e}");
    }
}

#[test]
fn control_tokens_are_never_text() {
    let tok = tokenizer();
    let words = vocab::token_bytes(tok);
    for id in [quarrel_synth::vocab::BOS_ID, quarrel_synth::vocab::EOS_ID, quarrel_synth::vocab::UNK_ID] {
        assert_eq!(words[id as usize][0], toktrie::TokTrie::SPECIAL_TOKEN_MARKER, "token {id}");
    }
    // every grammar mask leaves BOS out
    let mut c = compiler().compile(&ConstraintSpec::Regex("[a-z ]{1,8}".into())).unwrap();
    assert!(!c.mask().allows(quarrel_synth::vocab::BOS_ID));
}
