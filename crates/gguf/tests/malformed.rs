//! Corrupt files are clear errors, never panics or huge allocations.
//! Corruptions are generated from a written file and, when present, the real default model.

mod common;
use common::sample_file;
use proptest::prelude::*;
use quarrel_gguf::{Gguf, GgufError};

fn err(bytes: Vec<u8>) -> GgufError {
    match Gguf::from_bytes(bytes) {
        Ok(_) => panic!("corrupt file was accepted"),
        Err(e) => e,
    }
}

/// The error of `file` with `bytes` written over it at offset `at`.
fn patched_err(file: &[u8], at: usize, bytes: &[u8]) -> GgufError {
    let mut b = file.to_vec();
    b[at..at + bytes.len()].copy_from_slice(bytes);
    err(b)
}

#[test]
fn bad_magic() {
    let mut b = sample_file();
    b[0] = b'X';
    assert!(matches!(err(b), GgufError::BadMagic(_)));
}

#[test]
fn bad_version() {
    assert!(matches!(patched_err(&sample_file(), 4, &1u32.to_le_bytes()), GgufError::BadVersion(1)));
}

#[test]
fn absurd_counts() {
    let b = sample_file();
    let e = patched_err(&b, 8, &u64::MAX.to_le_bytes());
    assert!(matches!(e, GgufError::AbsurdCount { .. }), "{e}");
    assert!(matches!(patched_err(&b, 16, &(1u64 << 40).to_le_bytes()), GgufError::AbsurdCount { .. }));
}

#[test]
fn absurd_string_length() {
    // first key length lives right after the 24-byte header
    let e = patched_err(&sample_file(), 24, &(u64::MAX / 2).to_le_bytes());
    assert!(e.to_string().contains("string length"), "{e}");
}

#[test]
fn truncation_at_every_length_is_an_error() {
    let b = sample_file();
    let g = Gguf::from_bytes(b.clone()).unwrap();
    // the bytes after the last tensor's data are padding; cutting them loses nothing
    let end = g.tensors().iter().map(|t| g.data_offset() + (t.offset + t.n_bytes) as usize).max().unwrap();
    for n in 0..end {
        let e = err(b[..n].to_vec());
        let msg = e.to_string();
        assert!(!msg.is_empty());
    }
}

fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).position(|w| w == needle).unwrap()
}

/// Byte position of the fields after a tensor's name in the tensor-info table.
fn tensor_info_pos(b: &[u8], name: &str) -> usize {
    // tensor infos come after all metadata; search from the end of the metadata for the name
    // preceded by its u64 length
    let mut pat = (name.len() as u64).to_le_bytes().to_vec();
    pat.extend_from_slice(name.as_bytes());
    pat.extend_from_slice(&[1, 0, 0, 0]); // for rank-1 "c"
    find(b, &pat) + pat.len() - 4
}

#[test]
fn unknown_type_id_names_the_tensor() {
    let b = sample_file();
    let p = tensor_info_pos(&b, "c"); // rank u32, dim u64, type u32, offset u64
    let e = patched_err(&b, p + 12, &77u32.to_le_bytes());
    assert!(matches!(&e, GgufError::UnknownType { name, id: 77 } if name == "c"), "{e}");
}

#[test]
fn data_out_of_bounds_and_overlap() {
    let b0 = sample_file();
    let p = tensor_info_pos(&b0, "c");
    let e = patched_err(&b0, p + 16, &(1u64 << 30).to_le_bytes());
    assert!(e.to_string().contains("outside the data section"), "{e}");
    // the same offset as "a"
    assert!(matches!(patched_err(&b0, p + 16, &0u64.to_le_bytes()), GgufError::Overlap { .. }));
    // misaligned
    assert!(patched_err(&b0, p + 16, &3u64.to_le_bytes()).to_string().contains("alignment"));
}

#[test]
fn mismatched_dims() {
    let b0 = sample_file();
    let p = tensor_info_pos(&b0, "c");
    assert!(matches!(patched_err(&b0, p + 4, &(1u64 << 62).to_le_bytes()), GgufError::BadTensor { .. }));
    // rank 9
    assert!(patched_err(&b0, p, &9u32.to_le_bytes()).to_string().contains("rank"));
}

/// A real model: every single-byte corruption in the header region either parses or errors.
#[test]
fn corruptions_of_real_model_header() {
    let Some(path) = std::env::var_os("QUARREL_TEST_MODEL") else {
        eprintln!("QUARREL_TEST_MODEL not set: using the written sample only");
        return;
    };
    let mut full = std::fs::read(path).unwrap();
    let g = Gguf::from_bytes(full.clone()).unwrap();
    let header_len = g.data_offset();
    drop(g);
    let mut rng = 0x2545F4914F6CDD1Du64;
    let (mut ok, mut bad) = (0, 0);
    for _ in 0..2000 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let i = (rng as usize) % header_len;
        let old = full[i];
        full[i] = old.wrapping_add(1 + ((rng >> 32) as u8) % 255);
        match Gguf::validate(&full) {
            Ok(()) => ok += 1,
            Err(e) => {
                assert!(!e.to_string().is_empty());
                bad += 1
            }
        }
        full[i] = old;
    }
    // most corruptions of counts, lengths and type ids must be caught
    eprintln!("real-model corruptions: {ok} still valid (string/value bytes), {bad} rejected");
    assert!(bad > 0);
    // truncations anywhere are errors
    for cut in [10, 100, header_len / 2, header_len, full.len() - 1] {
        assert!(Gguf::validate(&full[..cut]).is_err(), "truncated at {cut} was accepted");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]
    #[test]
    fn random_corruptions_never_panic(edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
                                      cut in any::<prop::sample::Index>()) {
        let mut b = sample_file();
        for (i, v) in edits { let i = i.index(b.len()); b[i] = v; }
        let n = cut.index(b.len() + 1);
        b.truncate(n.max(b.len() * 3 / 4));
        let _ = Gguf::from_bytes(b);
    }

    #[test]
    fn random_bytes_never_panic(mut b in proptest::collection::vec(any::<u8>(), 0..512)) {
        if b.len() >= 8 { b[..4].copy_from_slice(b"GGUF"); b[4..8].copy_from_slice(&3u32.to_le_bytes()); }
        let _ = Gguf::from_bytes(b);
    }
}

/// A header of `u8` arrays with the given keys and lengths (and no tensors).
fn u8_arrays(arrays: &[(&str, u64)]) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(0u64.to_le_bytes());
    b.extend((arrays.len() as u64).to_le_bytes());
    for (key, n) in arrays {
        b.extend((key.len() as u64).to_le_bytes());
        b.extend(key.as_bytes());
        b.extend(9u32.to_le_bytes()); // array
        b.extend(0u32.to_le_bytes()); // of u8
        b.extend(n.to_le_bytes());
        b.resize(b.len() + *n as usize, 7);
    }
    b
}

/// Every parsed item takes far more memory than its byte in the file: arrays are bounded for
/// the whole header, so a big file cannot make the parser ask for many times its size.
#[test]
fn array_items_are_bounded_for_the_whole_header() {
    let max = quarrel_gguf::MAX_ARRAY_ITEMS;
    assert!(Gguf::from_bytes(u8_arrays(&[("small", 1000)])).is_ok());
    let e = err(u8_arrays(&[("huge", max + 1)]));
    assert!(matches!(&e, GgufError::TooManyItems { key, count, .. } if key == "huge" && *count == max + 1), "{e}");
    // the bound is for all arrays together: the second one passes it
    let e = err(u8_arrays(&[("a", max / 2 + 1), ("b", max / 2)]));
    assert!(matches!(&e, GgufError::TooManyItems { key, .. } if key == "b"), "{e}");
}
