//! The single type table: every tensor element type this crate knows, with its
//! GGML id, ggml name, block geometry and `vec_dot` activation partner.
//!
//! Everything here is generated from ONE `quant_types!` invocation, so adding a
//! type means adding one line (plus its kernels and a dispatch arm in `lib.rs`).
//! Values were checked against llama.cpp: ids in `ggml/include/ggml.h`, names
//! and sizes in `ggml/src/ggml.c` (`type_traits`), activation partners in
//! `ggml/src/ggml-cpu/ggml-cpu.c` (`type_traits_cpu`).

use std::fmt;

/// Static description of one element type (one row of the table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TypeInfo {
    pub ty: QuantType,
    /// `enum ggml_type` value.
    pub ggml_id: u32,
    /// Name as ggml prints it (`ggml_type_name`).
    pub name: &'static str,
    /// Elements per block.
    pub block_size: usize,
    /// Bytes per block.
    pub type_size: usize,
    /// Type the other operand of `vec_dot` must be in.
    pub vec_dot_type: QuantType,
    /// ggml's `is_quantized` flag.
    pub is_quantized: bool,
}

macro_rules! quant_types {
    ($(
        $(#[$meta:meta])*
        $variant:ident = $id:literal, $name:literal, block $bs:expr, bytes $ts:expr, dot $vdt:ident, quantized $q:literal;
    )+) => {
        /// A GGML tensor element type supported by this crate.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[allow(non_camel_case_types)]
        pub enum QuantType {
            $( $(#[$meta])* $variant, )+
        }

        /// The table itself, in declaration order (same order as [`QuantType::ALL`]).
        pub const TYPE_TABLE: &[TypeInfo] = &[
            $( TypeInfo {
                ty: QuantType::$variant,
                ggml_id: $id,
                name: $name,
                block_size: $bs,
                type_size: $ts,
                vec_dot_type: QuantType::$vdt,
                is_quantized: $q,
            }, )+
        ];

        impl QuantType {
            /// Every supported type, in table order.
            pub const ALL: &'static [QuantType] = &[ $( QuantType::$variant, )+ ];

            /// The table row describing this type.
            pub const fn info(self) -> &'static TypeInfo {
                // The enum discriminants are 0.. in declaration order, matching TYPE_TABLE.
                &TYPE_TABLE[self as usize]
            }
        }
    };
}

use crate::layout::*;

quant_types! {
    /// IEEE-754 binary32.
    F32    = 0,  "f32",    block 1,      bytes 4,                dot F32,  quantized false;
    /// IEEE-754 binary16.
    F16    = 1,  "f16",    block 1,      bytes 2,                dot F16,  quantized false;
    /// bfloat16 (upper half of an f32).
    BF16   = 30, "bf16",   block 1,      bytes 2,                dot BF16, quantized false;
    /// 4-bit, symmetric, one f16 scale per 32 elements.
    Q4_0   = 2,  "q4_0",   block QK4_0,  bytes BLOCK_Q4_0_SIZE,  dot Q8_0, quantized true;
    /// 4-bit, scale + min per 32 elements.
    Q4_1   = 3,  "q4_1",   block QK4_1,  bytes BLOCK_Q4_1_SIZE,  dot Q8_1, quantized true;
    /// 5-bit, symmetric.
    Q5_0   = 6,  "q5_0",   block QK5_0,  bytes BLOCK_Q5_0_SIZE,  dot Q8_0, quantized true;
    /// 5-bit, scale + min.
    Q5_1   = 7,  "q5_1",   block QK5_1,  bytes BLOCK_Q5_1_SIZE,  dot Q8_1, quantized true;
    /// 8-bit, symmetric (weights and activations).
    Q8_0   = 8,  "q8_0",   block QK8_0,  bytes BLOCK_Q8_0_SIZE,  dot Q8_0, quantized true;
    /// 8-bit activation type carrying `d * sum(q)` (partner of Q4_1/Q5_1).
    /// ggml defines no `vec_dot` for it; its `vec_dot_type` is itself.
    Q8_1   = 9,  "q8_1",   block QK8_1,  bytes BLOCK_Q8_1_SIZE,  dot Q8_1, quantized true;
    /// 2-bit K-quant (super-block of 256, 16 sub-blocks).
    Q2_K   = 10, "q2_K",   block QK_K,   bytes BLOCK_Q2_K_SIZE,  dot Q8_K, quantized true;
    /// 3-bit K-quant.
    Q3_K   = 11, "q3_K",   block QK_K,   bytes BLOCK_Q3_K_SIZE,  dot Q8_K, quantized true;
    /// 4-bit K-quant.
    Q4_K   = 12, "q4_K",   block QK_K,   bytes BLOCK_Q4_K_SIZE,  dot Q8_K, quantized true;
    /// 5-bit K-quant.
    Q5_K   = 13, "q5_K",   block QK_K,   bytes BLOCK_Q5_K_SIZE,  dot Q8_K, quantized true;
    /// 6-bit K-quant.
    Q6_K   = 14, "q6_K",   block QK_K,   bytes BLOCK_Q6_K_SIZE,  dot Q8_K, quantized true;
    /// 8-bit K activation type (f32 scale + 16 block sums). ggml leaves its
    /// `vec_dot_type` unset and defines no `vec_dot`; here it is itself.
    Q8_K   = 15, "q8_K",   block QK_K,   bytes BLOCK_Q8_K_SIZE,  dot Q8_K, quantized true;
    /// 4-bit non-linear (codebook `KVALUES_IQ4NL`), f16 scale per 32.
    IQ4_NL = 20, "iq4_nl", block QK4_NL, bytes BLOCK_IQ4_NL_SIZE, dot Q8_0, quantized true;
    /// OCP microscaling FP4 (E2M1 values, E8M0 shared exponent per 32).
    MXFP4  = 39, "mxfp4",  block QK_MXFP4, bytes BLOCK_MXFP4_SIZE, dot Q8_0, quantized true;
}

impl QuantType {
    /// Type for a GGML type id, `None` if unknown / unsupported.
    pub fn from_ggml_id(id: u32) -> Option<QuantType> {
        TYPE_TABLE.iter().find(|t| t.ggml_id == id).map(|t| t.ty)
    }

    /// GGML type id (`enum ggml_type`).
    pub fn ggml_id(self) -> u32 {
        self.info().ggml_id
    }

    /// Name as ggml prints it (`"q4_0"`, `"q4_K"`, `"bf16"`, `"iq4_nl"`, ...).
    pub fn name(self) -> &'static str {
        self.info().name
    }

    /// Case-insensitive lookup by ggml name (`"Q4_K"` and `"q4_k"` both work).
    pub fn from_name(s: &str) -> Option<QuantType> {
        TYPE_TABLE.iter().find(|t| t.name.eq_ignore_ascii_case(s)).map(|t| t.ty)
    }

    /// Elements per block.
    pub fn block_size(self) -> usize {
        self.info().block_size
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        self.info().type_size
    }

    /// Type the activation operand of [`crate::vec_dot`] must be quantized to.
    pub fn vec_dot_type(self) -> QuantType {
        self.info().vec_dot_type
    }

    /// Bytes needed for `n_elements` elements; `None` if `n_elements` is not a
    /// multiple of the block size or the size overflows `usize`.
    pub fn row_bytes(self, n_elements: usize) -> Option<usize> {
        let bs = self.block_size();
        if !n_elements.is_multiple_of(bs) {
            return None;
        }
        (n_elements / bs).checked_mul(self.type_size())
    }

    /// ggml's `is_quantized` (false for F32/F16/BF16).
    pub fn is_quantized(self) -> bool {
        self.info().is_quantized
    }
}

impl fmt::Display for QuantType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

// Compile-time consistency of the table: discriminant order == table order,
// and the block geometry matches the byte layouts in `layout`.
const _: () = {
    let mut i = 0;
    while i < TYPE_TABLE.len() {
        assert!(TYPE_TABLE[i].ty as usize == i);
        assert!(TYPE_TABLE[i].block_size > 0 && TYPE_TABLE[i].type_size > 0);
        i += 1;
    }
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_names_unique_and_roundtrip() {
        for (i, a) in TYPE_TABLE.iter().enumerate() {
            assert_eq!(QuantType::from_ggml_id(a.ggml_id), Some(a.ty));
            assert_eq!(QuantType::from_name(a.name), Some(a.ty));
            assert_eq!(QuantType::from_name(&a.name.to_ascii_uppercase()), Some(a.ty));
            for b in &TYPE_TABLE[i + 1..] {
                assert_ne!(a.ggml_id, b.ggml_id);
                assert_ne!(a.name, b.name);
            }
        }
        assert_eq!(QuantType::ALL.len(), TYPE_TABLE.len());
        assert_eq!(QuantType::from_ggml_id(4), None);
        assert_eq!(QuantType::from_name("q4_3"), None);
    }

    #[test]
    fn ggml_values() {
        use QuantType::*;
        let expect: &[(QuantType, u32, &str, usize, usize)] = &[
            (F32, 0, "f32", 1, 4),
            (F16, 1, "f16", 1, 2),
            (Q4_0, 2, "q4_0", 32, 18),
            (Q4_1, 3, "q4_1", 32, 20),
            (Q5_0, 6, "q5_0", 32, 22),
            (Q5_1, 7, "q5_1", 32, 24),
            (Q8_0, 8, "q8_0", 32, 34),
            (Q8_1, 9, "q8_1", 32, 36),
            (Q2_K, 10, "q2_K", 256, 84),
            (Q3_K, 11, "q3_K", 256, 110),
            (Q4_K, 12, "q4_K", 256, 144),
            (Q5_K, 13, "q5_K", 256, 176),
            (Q6_K, 14, "q6_K", 256, 210),
            (Q8_K, 15, "q8_K", 256, 292),
            (IQ4_NL, 20, "iq4_nl", 32, 18),
            (BF16, 30, "bf16", 1, 2),
            (MXFP4, 39, "mxfp4", 32, 17),
        ];
        for &(t, id, name, bs, ts) in expect {
            assert_eq!((t.ggml_id(), t.name(), t.block_size(), t.type_size()), (id, name, bs, ts), "{t:?}");
        }
        assert_eq!(Q4_1.vec_dot_type(), Q8_1);
        assert_eq!(Q4_K.vec_dot_type(), Q8_K);
        assert_eq!(MXFP4.vec_dot_type(), Q8_0);
        assert_eq!(Q4_0.row_bytes(64), Some(36));
        assert_eq!(Q4_0.row_bytes(33), None);
        assert_eq!(Q8_0.row_bytes(usize::MAX / 32 * 32), None);
        assert!(!BF16.is_quantized() && Q8_K.is_quantized());
    }
}
