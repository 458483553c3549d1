//! Rebuild when anything under `web/` changes (the UI assets are embedded by `ui.rs`; a new file
//! would otherwise not be picked up until another change triggers a rebuild).
fn main() {
    println!("cargo:rerun-if-changed=../../web");
}
