//! llama.cpp's file types (`general.file_type`, `enum llama_ftype`): id, name and the
//! default tensor type of each. Loading reads a file's type through it (model summaries,
//! `quarrel bench`'s model column); `quantize` and the synthetic-model writer (quarrel-synth)
//! pick per-tensor types from it.

use quarrel_quant::QuantType;

macro_rules! ftypes {
    ($( $(#[$m:meta])* $v:ident = $id:literal, $name:literal, $default:ident; )+) => {
        /// A llama.cpp file type (`enum llama_ftype` in `include/llama.h`).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[allow(non_camel_case_types)]
        pub enum Ftype { $( $(#[$m])* $v, )+ }

        impl Ftype {
            /// Every supported file type, in `llama_ftype` order.
            pub const ALL: &'static [Ftype] = &[ $( Ftype::$v, )+ ];

            /// The `general.file_type` value.
            pub fn llama_ftype(self) -> u32 {
                match self { $( Ftype::$v => $id, )+ }
            }

            /// CLI name (`q4_k_m`), as llama-quantize spells it but lower case.
            pub fn name(self) -> &'static str {
                match self { $( Ftype::$v => $name, )+ }
            }

            /// The type most tensors get (`llama_ftype_get_default_type`).
            pub fn default_type(self) -> QuantType {
                match self { $( Ftype::$v => QuantType::$default, )+ }
            }
        }
    };
}

ftypes! {
    F32 = 0, "f32", F32;
    F16 = 1, "f16", F16;
    Q4_0 = 2, "q4_0", Q4_0;
    Q4_1 = 3, "q4_1", Q4_1;
    Q8_0 = 7, "q8_0", Q8_0;
    Q5_0 = 8, "q5_0", Q5_0;
    Q5_1 = 9, "q5_1", Q5_1;
    Q2_K = 10, "q2_k", Q2_K;
    Q3_K_S = 11, "q3_k_s", Q3_K;
    Q3_K_M = 12, "q3_k_m", Q3_K;
    Q3_K_L = 13, "q3_k_l", Q3_K;
    Q4_K_S = 14, "q4_k_s", Q4_K;
    Q4_K_M = 15, "q4_k_m", Q4_K;
    Q5_K_S = 16, "q5_k_s", Q5_K;
    Q5_K_M = 17, "q5_k_m", Q5_K;
    Q6_K = 18, "q6_k", Q6_K;
    /// llama-quantize insists on an imatrix for it; random weights need none.
    Q2_K_S = 21, "q2_k_s", Q2_K;
    IQ4_NL = 25, "iq4_nl", IQ4_NL;
    BF16 = 32, "bf16", BF16;
}

impl Ftype {
    /// Parse a CLI name, case-insensitively: `q4_k_m`, `Q4_K_M`, `q4_K`, `q3_k` (= Q3_K_M,
    /// as llama-quantize's aliases), `q4_k` (= Q4_K_M), `q5_k` (= Q5_K_M), `fp16`, `fp32`.
    pub fn from_name(s: &str) -> Option<Ftype> {
        let l = s.to_ascii_lowercase().replace('-', "_");
        let alias = match l.as_str() {
            "q3_k" => "q3_k_m",
            "q4_k" => "q4_k_m",
            "q5_k" => "q5_k_m",
            "fp16" => "f16",
            "fp32" | "all_f32" => "f32",
            other => other,
        };
        Ftype::ALL.iter().copied().find(|f| f.name() == alias)
    }

    /// Names of every file type, for help texts and errors.
    pub fn names() -> Vec<&'static str> {
        Ftype::ALL.iter().map(|f| f.name()).collect()
    }
}

impl std::fmt::Display for Ftype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
