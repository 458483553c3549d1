//! Differential tests against llama.cpp outputs recorded in tests/fixtures/tokenizer/
//! (see its README): 400 random strings per model, and the whole GPL-3 text.

mod common;

use common::{check_gpl3, check_random_cases, load, GEMMA3, SMOLLM2};

/// One test per model and check: `$check(&tokenizer, $fixture)` where the model is there.
macro_rules! reference_tests {
    ($($name:ident: $model:ident, $check:ident, $fixture:literal;)*) => {$(
        #[test]
        fn $name() {
            if let Some(tok) = load($model) {
                $check(&tok, $fixture);
            }
        }
    )*};
}

reference_tests! {
    smollm2_random_strings: SMOLLM2, check_random_cases, "tokenizer/smollm2-random.json";
    gemma3_random_strings: GEMMA3, check_random_cases, "tokenizer/gemma3-random.json";
    smollm2_gpl3: SMOLLM2, check_gpl3, "tokenizer/smollm2-gpl3.json";
    gemma3_gpl3: GEMMA3, check_gpl3, "tokenizer/gemma3-gpl3.json";
}
