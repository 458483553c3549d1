//! `granitemoe`: the Granite stack of [`super::granite`] (one implementation for granite,
//! granitemoe and granitehybrid; the file's metadata and tensors choose dense / experts /
//! Mamba2 layers).

pub use super::granite::load;
