//! Special ids, EOG set and flags as llama.cpp derives them for the two real models.

mod common;

use common::{load, GEMMA3, SMOLLM2};
use quarrel_tokenizer::VocabKind;

#[test]
fn smollm2_special_tokens() {
    let Some(tok) = load(SMOLLM2) else { return };
    assert_eq!(tok.kind(), VocabKind::Bpe);
    assert_eq!(tok.pre_name(), "smollm");
    assert_eq!(tok.n_vocab(), 49152);
    assert_eq!((tok.bos_id(), tok.eos_id(), tok.unk_id(), tok.pad_id()), (Some(1), Some(2), Some(0), Some(2)));
    assert!(!tok.add_bos() && !tok.add_eos() && !tok.add_space_prefix());
    // llama.cpp: EOG = <|endoftext|>, <|im_end|>, <reponame> (detected as FIM repo token)
    assert_eq!(tok.eog_ids(), vec![0, 2, 4]);
    assert!(tok.is_eog(2) && !tok.is_eog(1) && !tok.is_eog(u32::MAX));
    assert_eq!(tok.token_id("<|im_end|>"), Some(2));
    assert_eq!(tok.eot_id(), Some(2));
    assert!(tok.token_attr(1).is_control());
    assert!(tok.chat_template().is_some());
}

#[test]
fn gemma3_special_tokens() {
    let Some(tok) = load(GEMMA3) else { return };
    assert_eq!(tok.kind(), VocabKind::Spm);
    assert_eq!(tok.n_vocab(), 262144);
    assert_eq!((tok.bos_id(), tok.eos_id(), tok.unk_id(), tok.pad_id()), (Some(2), Some(1), Some(3), Some(0)));
    assert!(tok.add_bos() && !tok.add_eos() && !tok.add_space_prefix());
    // llama.cpp: EOG = <eos>, <end_of_turn>, and "</s>"
    assert_eq!(tok.eog_ids(), vec![1, 106, 212]);
    assert_eq!(tok.eot_id(), Some(106));
    assert_eq!(tok.token_text(106), Some("<end_of_turn>"));
    assert!(tok.chat_template().is_none());
}
