//! Tables transcribed from llama.cpp's `llama-vocab.cpp`: the pre-tokenizer type for each
//! `tokenizer.ggml.pre` name (with the flags llama.cpp sets alongside), and the regexes
//! each type runs (verbatim string literals, so the dispatch to the hand-written splitters
//! by exact string comparison works as it does there).

macro_rules! pre_kinds {
    ($($kind:ident),* $(,)?) => {
        /// llama.cpp's `llama_vocab_pre_type`, for the types whose regexes we can run.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[allow(missing_docs)]
        pub enum PreKind {
            $($kind),*
        }

        impl PreKind {
            /// Every type, in declaration order.
            pub const ALL: &'static [PreKind] = &[$(PreKind::$kind),*];
        }
    };
}

pre_kinds! {
    Default,
    Llama3,
    Jais2,
    Dbrx,
    Smaug,
    DeepseekLlm,
    Deepseek3Llm,
    HunyuanDense,
    JoyaiLlm,
    HyV4,
    Spark25,
    Youtu,
    DeepseekCoder,
    Falcon,
    Starcoder,
    Refact,
    CommandR,
    Smollm,
    Codeshell,
    Exaone,
    Minerva,
    Mellum2,
    Gpt2,
    Mpt,
    Olmo,
    Jais,
    Trillion,
    GraniteDocling,
    Stablelm2,
    Qwen2,
    Hunyuan,
    SolarOpen,
    Qwen35,
    Poro,
    Bloom,
    Gpt3Finnish,
    Chatglm4,
    Viking,
    Tekken,
    Chameleon,
    Gpt4o,
    MinimaxM2,
    GraniteEmbMulti,
    TinyAya,
    KimiK2,
    Superbpe,
    Bailingmoe,
    SeedCoder,
    Ufakzeka,
    Grok2,
    Afmoe,
    Laguna,
    ExaoneMoe,
    Gemma4,
    SarvamMoe,
    Minicpm5,
    Whitespace,
}

/// The regexes llama.cpp's `llm_tokenizer_bpe` uses for each pre-tokenizer type, verbatim.
pub(crate) fn regex_exprs(kind: PreKind) -> &'static [&'static str] {
    use PreKind::*;
    match kind {
        Llama3 => &[
            "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        Jais2 => &[
            "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}",
        ],
        Dbrx | Smaug => &[
            "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        DeepseekLlm => &[
            "[\r\n]",
            "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
            "\\s?[!-/:-~！-／：-～‘-‟　-。]+",
            "\\s+$",
            "[一-龥ࠀ-一가-퟿]+",
            "\\p{N}+",
        ],
        Deepseek3Llm | HunyuanDense | JoyaiLlm | HyV4 => &[
            "\\p{N}{1,3}",
            "[一-龥぀-ゟ゠-ヿ]+",
            "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
        ],
        Spark25 => &[
            "\\p{N}{1,3}",
            "[一-龥぀-ゟ゠-ヿ]+",
            "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+|[\r\n]|\\s+(?!\\S)|\\s+",
            "\\p{N}",
        ],
        Youtu => &[
            "[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+",
            "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        DeepseekCoder => &[
            "[\r\n]",
            "\\s?\\p{L}+",
            "\\s?\\p{P}+",
            "[一-龥ࠀ-一가-퟿]+",
            "\\p{N}",
        ],
        Falcon => &[
            "[\\p{P}\\$\\+<=>\\^~\\|`]+",
            "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
            "[0-9][0-9][0-9]",
        ],
        Starcoder | Refact | CommandR | Smollm | Codeshell | Exaone | Minerva | Mellum2 => &[
            "\\p{N}",
            "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
        ],
        Gpt2 | Mpt | Olmo | Jais | Trillion | GraniteDocling => &[
            "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
        ],
        Stablelm2 | Qwen2 | Hunyuan | SolarOpen => &[
            "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        Qwen35 => &[
            "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        Poro | Bloom | Gpt3Finnish => &[
            " ?[^(\\s|.,!?…。，、।۔،)]+",
        ],
        Chatglm4 => &[
            "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        Viking => &[
            " ?[^(\\s|.,!?…。，、।۔،)]+",
            "\\p{N}",
        ],
        Tekken => &[
            "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        Chameleon => &[
            "<sentinel:[0-9]+>",
            "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
            "([\\t\\n]|    |  )",
            "\\p{N}",
            "[\\p{P}!-/:-@\\[-`{-~]",
            "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
        ],
        Gpt4o | MinimaxM2 => &[
            "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        GraniteEmbMulti => &[
            "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))*((?=[\\p{L}\\p{M}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))+((?=[\\p{L}\\p{M}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        TinyAya => &[
            "\\d{1,3}(?=(?:\\d{3})*\\b)",
            "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        KimiK2 => &[
            "\\p{Han}+",
        ],
        Superbpe => &[
            "\\p{N}+",
            "(?=(\\d{3})+(?!\\d))",
        ],
        Bailingmoe => &[
            "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
        ],
        SeedCoder => &[
            "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        Ufakzeka => &[
            "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        Grok2 => &[
            "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        Afmoe => &[
            "\\p{AFMoE_digits}",
            "[一-鿿㐀-䶿豈-﫿぀-ゟ゠-ヿ･-ﾟ⼀-⿟เ-๿຀-໿ក-៿က-႟ꩠ-ꩿꧠ-꧿가-힯ᄀ-ᇿ]+",
            "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        Laguna => &[
            "[^\\n]+|[\\n]+",
            "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        ExaoneMoe => &[
            "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
        ],
        Gemma4 => &[
            "[^\\n]+|[\\n]+",
        ],
        SarvamMoe => &[
            "[^\\n]+|[\\n]+",
        ],
        Minicpm5 => &[
            "\\p{N}{1,3}",
            "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        Whitespace => &[
            "\\S+",
        ],
        Default => &[
            "[\\p{P}\\$\\+<=>\\^~\\|]+",
            "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
            "\\p{N}+",
            "[0-9][0-9][0-9]",
        ],
    }
}

/// What a `tokenizer.ggml.pre` name selects: the type plus the vocabulary flags llama.cpp
/// sets for it (before `add_bos_token` etc. from the GGUF override them).
#[derive(Clone, Copy, Debug)]
pub(crate) struct PreConfig {
    pub kind: PreKind,
    pub ignore_merges: bool,
    pub clean_spaces: bool,
    pub add_bos: bool,
    pub bos_null: bool,
}

/// Resolves a `tokenizer.ggml.pre` value like llama.cpp's `llama_vocab::impl::load`.
/// Returns `None` for names llama.cpp does not know.
pub(crate) fn pre_config(name: &str) -> Option<PreConfig> {
    use PreKind::*;
    // (kind, ignore_merges, clean_spaces, add_bos, bos_null)
    let (kind, ignore_merges, clean_spaces, add_bos, bos_null) = match name {
        "" | "default" => (Default, false, true, false, false),
        "minicpm5" => (Minicpm5, true, true, false, false),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2" | "jina-v5-nano" => {
            (Llama3, true, true, true, false)
        }
        "deepseek-llm" => (DeepseekLlm, false, false, false, false),
        "deepseek-coder" => (DeepseekCoder, false, false, false, false),
        "deepseek-v3" => (Deepseek3Llm, false, false, false, false),
        "spark2_5" => (Spark25, false, false, false, false),
        "youtu" => (Youtu, true, false, false, false),
        "falcon" => (Falcon, false, true, false, false),
        "mpt" => (Mpt, false, true, false, false),
        "starcoder" => (Starcoder, false, true, false, false),
        // "gpt2" is not a name llama.cpp knows; accepted here as an alias of "gpt-2".
        "gpt-2" | "gpt2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de" | "a.x-4.0" | "mellum"
        | "modern-bert" => (Gpt2, false, true, false, false),
        "jais-2" => (Jais2, false, true, false, false),
        "gemma4" | "granite-embed-multi-311m" => (Gemma4, false, true, false, false),
        "sarvam-moe" => (SarvamMoe, false, false, false, false),
        "jina-v1-en" | "jina-v2-code" | "roberta-bpe" => (Gpt2, false, true, false, false),
        "whitespace" => (Whitespace, false, true, false, false),
        "refact" => (Refact, false, true, false, false),
        "command-r" => (CommandR, false, false, false, false),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" => (Qwen2, false, false, false, false),
        "qwen35" => (Qwen35, false, false, false, false),
        "stablelm2" => (Stablelm2, false, true, false, false),
        "olmo" => (Olmo, false, true, false, false),
        "dbrx" => (Dbrx, false, true, false, false),
        "smaug-bpe" => (Smaug, false, true, false, false),
        "poro-chat" => (Poro, false, false, false, false),
        "chatglm-bpe" => (Chatglm4, false, true, false, true),
        "glm4" | "glm5" => (Chatglm4, true, true, false, true),
        "viking" => (Viking, false, false, false, false),
        "jais" => (Jais, false, true, false, false),
        "tekken" => (Tekken, true, false, true, false),
        "smollm" => (Smollm, false, false, false, false),
        "codeshell" => (Codeshell, false, true, false, false),
        "bloom" => (Bloom, false, true, false, false),
        "gpt3-finnish" => (Gpt3Finnish, false, true, false, false),
        "exaone" => (Exaone, false, true, false, false),
        "exaone4" => (Gpt2, false, true, false, false),
        "exaone-moe" => (ExaoneMoe, false, true, false, false),
        "chameleon" => (Chameleon, false, false, true, false),
        "minerva-7b" => (Minerva, false, true, false, false),
        "megrez" => (Qwen2, false, true, false, false),
        "gpt-4o" | "llama4" | "kanana2" | "talkie" => (Gpt4o, false, false, false, false),
        "granite-embed-multi-97m" => (GraniteEmbMulti, true, false, false, false),
        "tiny_aya" | "cohere2moe" => (TinyAya, false, false, false, false),
        "superbpe" => (Superbpe, false, false, false, false),
        "trillion" => (Trillion, false, false, false, false),
        "granite-docling" => (GraniteDocling, false, false, false, false),
        "bailingmoe" | "bailingmoe2" | "llada-moe" => (Bailingmoe, false, false, false, false),
        "seed-coder" => (SeedCoder, false, false, false, false),
        "hunyuan" => (Hunyuan, false, false, false, false),
        "hunyuan-dense" => (HunyuanDense, false, false, false, false),
        "hy_v4" => (HyV4, false, false, false, false),
        "joyai-llm" => (JoyaiLlm, false, false, false, false),
        "kimi-k2" => (KimiK2, false, false, false, false),
        "ufakzeka" => (Ufakzeka, false, false, false, false),
        "grok-2" => (Grok2, false, false, false, false),
        "afmoe" => (Afmoe, false, false, false, false),
        "laguna" => (Laguna, false, false, false, false),
        "minimax-m2" => (MinimaxM2, false, false, false, false),
        "solar-open" => (SolarOpen, false, false, false, false),
        "mellum2" => (Mellum2, false, true, false, false),
        _ => return None,
    };
    Some(PreConfig { kind, ignore_merges, clean_spaces, add_bos, bos_null })
}

/// Types whose splitting needs something we do not implement (a custom llama.cpp routine
/// other than the common ones, or raw-UTF-8 "SPM-style" BPE).
pub(crate) fn unsupported_reason(kind: PreKind) -> Option<&'static str> {
    use PreKind::*;
    match kind {
        KimiK2 => Some("kimi-k2 uses a custom Han-aware splitter"),
        Afmoe => Some("afmoe uses a custom digit-grouping splitter"),
        TinyAya => Some("tiny_aya uses a custom digit-grouping splitter"),
        Gemma4 | SarvamMoe => Some("SPM-style BPE on raw UTF-8 (no byte encoding) is not implemented"),
        Whitespace => Some("the whitespace tokenizer is not implemented"),
        _ => None,
    }
}
