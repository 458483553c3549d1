//! A model's default numerics come from its description: invariant for the tiny synthetic
//! models with routed experts or Mamba2 layers (Mixtral-style MoE, Nemotron-H MoE, Mamba2,
//! Granite hybrid), fast for dense transformers.

use quarrel_core::Numerics;
use quarrel_gguf::Gguf;
use quarrel_models::ModelDescription;
use quarrel_synth::archs::{write_arch_synth, ArchPreset, ArchSynthSpec};
use quarrel_synth::{write_synth, Ftype, Preset, SynthSpec};

fn describe(path: &std::path::Path) -> ModelDescription {
    ModelDescription::from_gguf(&Gguf::open(path).unwrap()).unwrap()
}

#[test]
fn default_numerics_follow_the_architecture() {
    let dir = tempfile::tempdir().unwrap();
    let dense = dir.path().join("tiny.gguf");
    write_synth(&SynthSpec::new(*Preset::by_name("tiny").unwrap(), Ftype::F32).seed(1), &dense, &mut |_, _| {}).unwrap();
    let d = describe(&dense);
    assert_eq!((d.arch.as_str(), d.routed_experts, d.recurrent_state), ("llama", false, false));
    assert_eq!(d.default_numerics(), Numerics::Fast);
    for (name, experts, recurrent) in [
        ("tiny-mixtral", true, false),
        ("tiny-nemotron-h-moe", true, true),
        ("tiny-mamba2", false, true),
        ("tiny-granitehybrid", true, true),
        ("tiny-nemotron-h", false, true),
        ("tiny-granite", false, false),
    ] {
        let path = dir.path().join(format!("{name}.gguf"));
        let spec = ArchSynthSpec {
            preset: *ArchPreset::by_name(name).unwrap_or_else(|| panic!("preset {name}")),
            ftype: Ftype::F32,
            seed: 1,
            vocab_from: None,
        };
        write_arch_synth(&spec, &path, &mut |_, _| {}).unwrap();
        let d = describe(&path);
        assert_eq!((d.routed_experts, d.recurrent_state, d.encoder), (experts, recurrent, false), "{name}");
        let want = if experts || recurrent { Numerics::Invariant } else { Numerics::Fast };
        assert_eq!(d.default_numerics(), want, "{name}");
    }
    for name in ["tiny-bert", "tiny-nomic-bert"] {
        let path = dir.path().join(format!("{name}.gguf"));
        let spec = ArchSynthSpec { preset: *ArchPreset::by_name(name).unwrap(), ftype: Ftype::F32, seed: 1, vocab_from: None };
        write_arch_synth(&spec, &path, &mut |_, _| {}).unwrap();
        let d = describe(&path);
        assert!(d.encoder && !d.routed_experts && !d.recurrent_state, "{name}: {d:?}");
    }
}
