//! A small file with every kind of metadata, written by our writer.
#![allow(dead_code)]

use quarrel_gguf::{GgufWriter, QuantType, Value, ValueType};

pub fn sample_file() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.set("general.architecture", Value::String("llama".into()));
    w.set("general.alignment", Value::U32(64));
    w.set("llama.block_count", Value::U32(2));
    w.set("some.i8", Value::I8(-3));
    w.set("some.f64", Value::F64(1.5));
    w.set("some.bool", Value::Bool(true));
    w.set("tokenizer.ggml.tokens", Value::Array(ValueType::String, vec![Value::String("a".into()), Value::String("ü".into())]));
    w.set(
        "nested",
        Value::Array(
            ValueType::Array,
            vec![Value::Array(ValueType::I32, vec![Value::I32(1), Value::I32(-2)]), Value::Array(ValueType::U8, vec![])],
        ),
    );
    w.add_tensor("a", &[64, 2], QuantType::F32).unwrap();
    w.add_tensor("b", &[32, 3], QuantType::Q8_0).unwrap();
    w.add_tensor("c", &[5], QuantType::F16).unwrap();
    let a: Vec<u8> = (0..64 * 2 * 4).map(|i| i as u8).collect();
    let b: Vec<u8> = (0..34 * 3).map(|i| (i * 7) as u8).collect();
    let c: Vec<u8> = vec![1; 10];
    w.to_bytes(&[&a, &b, &c]).unwrap()
}
