//! Writer -> reader round trips, and a proptest over arbitrary metadata.

use proptest::prelude::*;
mod common;
use common::sample_file;
use quarrel_gguf::{Gguf, GgufWriter, QuantType, Value, ValueType};

#[test]
fn roundtrip_metadata_and_tensors() {
    let bytes = sample_file();
    let g = Gguf::from_bytes(bytes).unwrap();
    assert_eq!(g.version, 3);
    assert_eq!(g.alignment, 64);
    assert_eq!(g.architecture().unwrap(), "llama");
    assert_eq!(g.get_u64("llama.block_count").unwrap(), Some(2));
    assert_eq!(g.get("some.i8"), Some(&Value::I8(-3)));
    assert_eq!(g.get_f64("some.f64").unwrap(), Some(1.5));
    assert_eq!(g.get_bool("some.bool").unwrap(), Some(true));
    let nested = g.get_array("nested").unwrap().unwrap();
    assert_eq!(nested[0], Value::Array(ValueType::I32, vec![Value::I32(1), Value::I32(-2)]));
    assert_eq!(nested[1], Value::Array(ValueType::U8, vec![]));
    let (ti, data) = g.tensor("b").unwrap();
    assert_eq!(ti.ty, QuantType::Q8_0);
    assert_eq!(ti.dims, vec![32, 3]);
    assert_eq!(data.len(), 102);
    assert_eq!(data[1], 7);
    assert_eq!(ti.offset % 64, 0);
    assert_eq!(g.tensor("c").unwrap().1, &[1u8; 10][..]);
    // wrong type access is an error, not a panic
    assert!(g.get_u64("general.architecture").is_err());
}

#[test]
fn version_2_is_read() {
    let mut bytes = sample_file();
    bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
    assert_eq!(Gguf::from_bytes(bytes).unwrap().version, 2);
}

/// Tensor data written in chunks give the same file as whole tensors; too many bytes, or a
/// whole tensor after part of one, are errors.
#[test]
fn chunked_tensor_data() {
    let mut w = GgufWriter::new();
    w.set("general.architecture", Value::String("llama".into()));
    w.add_tensor("a", &[5, 3], QuantType::F32).unwrap();
    w.add_tensor("b", &[7], QuantType::F16).unwrap();
    let a: Vec<u8> = (0..60).collect();
    let b: Vec<u8> = (100..114).collect();
    let whole = w.to_bytes(&[&a, &b]).unwrap();
    let mut sink = w.write_header(Vec::new()).unwrap();
    for part in [&a[..7], &a[7..7], &a[7..60], &b[..1]] {
        sink.write_chunk(part).unwrap();
    }
    assert!(sink.write_tensor(&b).is_err(), "b is half written");
    assert!(sink.write_chunk(&b[1..]).is_ok());
    assert!(sink.write_chunk(&[0]).is_err(), "no tensor left");
    assert_eq!(sink.finish().unwrap(), whole);
    let mut sink = w.write_header(Vec::new()).unwrap();
    assert!(sink.write_chunk(&[0; 61]).is_err(), "a holds 60 bytes");
}

fn arb_scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<u8>().prop_map(Value::U8),
        any::<i8>().prop_map(Value::I8),
        any::<u16>().prop_map(Value::U16),
        any::<i16>().prop_map(Value::I16),
        any::<u32>().prop_map(Value::U32),
        any::<i32>().prop_map(Value::I32),
        any::<u64>().prop_map(Value::U64),
        any::<i64>().prop_map(Value::I64),
        any::<bool>().prop_map(Value::Bool),
        (-1e6f32..1e6).prop_map(Value::F32),
        (-1e6f64..1e6).prop_map(Value::F64),
        ".{0,12}".prop_map(Value::String),
    ]
}

fn arb_value() -> impl Strategy<Value = Value> {
    arb_scalar().prop_recursive(3, 24, 6, |inner| {
        // arrays are homogeneous: take one sample and repeat values of its type
        (inner, 0usize..5).prop_map(|(v, n)| Value::Array(v.value_type(), vec![v; n]))
    })
}

proptest! {
    #[test]
    fn arbitrary_metadata_roundtrips(kvs in proptest::collection::btree_map("[a-z.]{1,10}", arb_value(), 0..8)) {
        let mut w = GgufWriter::new();
        for (k, v) in &kvs { w.set(k, v.clone()); }
        let g = Gguf::from_bytes(w.to_bytes(&[]).unwrap()).unwrap();
        for (k, v) in &kvs { prop_assert_eq!(g.get(k), Some(v)); }
    }
}
