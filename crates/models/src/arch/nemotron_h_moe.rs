//! `nemotron_h_moe`: the single-mixer block stack of [`super::nemotron_h`] (one implementation for
//! nemotron_h, nemotron_h_moe and mamba2; the file's per-layer metadata chooses each
//! layer's mixer).

pub use super::nemotron_h::load;
