//! Bit-exact comparison against fixtures produced by
//! `scripts/gen_quant_fixtures.py` (gguf-py numpy oracle + ggml's own
//! reference quantizers through ctypes). Every type in the table must have a
//! fixture file, a dequantize case and at least one quantize oracle.

mod common;

use common::{hex, hex_f32};
use quarrel_quant::{dequantize, quantize, QuantType};
use serde_json::Value;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/quant/");

fn load(ty: QuantType) -> Value {
    let path = format!("{DIR}{}.json", ty.name());
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("missing fixture {path} ({e}); run scripts/gen_quant_fixtures.py"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("bad fixture {path}: {e}"))
}

fn s<'a>(v: &'a Value, k: &str) -> &'a str {
    v[k].as_str().unwrap_or_else(|| panic!("fixture field {k} missing"))
}

fn u(v: &Value, k: &str) -> usize {
    v[k].as_u64().unwrap_or_else(|| panic!("fixture field {k} missing")) as usize
}

#[test]
fn table_matches_fixture_metadata() {
    for &ty in QuantType::ALL {
        let f = load(ty);
        assert_eq!(s(&f, "type"), ty.name());
        assert_eq!(QuantType::from_name(s(&f, "gguf_name")), Some(ty), "gguf enum name of {ty}");
        assert_eq!(u(&f, "ggml_id"), ty.ggml_id() as usize, "{ty}");
        assert_eq!(u(&f, "block_size"), ty.block_size(), "{ty}");
        assert_eq!(u(&f, "type_size"), ty.type_size(), "{ty}");
    }
}

#[test]
fn dequantize_is_bit_exact() {
    for &ty in QuantType::ALL {
        let f = load(ty);
        let d = &f["dequantize"];
        let n = u(d, "n");
        let src = hex(s(d, "src"));
        let expected = hex_f32(s(d, "expected_f32"));
        assert_eq!(expected.len(), n);
        let mut got = vec![0f32; n];
        dequantize(ty, &src, &mut got).unwrap();
        let mismatches: Vec<_> = (0..n).filter(|&i| got[i].to_bits() != expected[i].to_bits()).map(|i| (i, got[i], expected[i])).collect();
        assert!(
            mismatches.is_empty(),
            "{ty}: {} of {n} values differ ({}), first: {:?}",
            mismatches.len(),
            s(d, "oracle"),
            &mismatches[..mismatches.len().min(5)]
        );
    }
}

#[test]
fn quantize_is_bit_exact() {
    for &ty in QuantType::ALL {
        let f = load(ty);
        let q = &f["quantize"];
        let x = hex_f32(s(q, "src_f32"));
        assert_eq!(x.len(), u(q, "n"));
        let entries = q["expected"].as_array().expect("quantize.expected");
        assert!(
            entries.iter().any(|e| s(e, "variant") == "ref"),
            "{ty}: no quantize oracle in fixture (regenerate with the ggml library available)"
        );
        for e in entries {
            let expected = hex(s(e, "expected"));
            let mut got = vec![0u8; expected.len()];
            match s(e, "variant") {
                "ref" => quantize(ty, &x, &mut got).unwrap(),
                "search" => {
                    assert_eq!(ty, QuantType::IQ4_NL);
                    quarrel_quant::iq4_nl::quantize_row_search(&x, &mut got)
                }
                v => panic!("unknown variant {v}"),
            }
            if got != expected {
                let bs = ty.type_size();
                let first = (0..got.len()).find(|&i| got[i] != expected[i]).unwrap();
                panic!(
                    "{ty}: quantize differs from {} at byte {first} (block {}, offset {})\n got: {:02x?}\nwant: {:02x?}",
                    s(e, "oracle"),
                    first / bs,
                    first % bs,
                    &got[first / bs * bs..(first / bs + 1) * bs],
                    &expected[first / bs * bs..(first / bs + 1) * bs],
                );
            }
        }
    }
}
