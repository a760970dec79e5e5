//! Writes the `ipam.weir.dev` CustomResourceDefinitions to `deploy/crds/` (or the directory given).
//!
//! `cargo run -p ipam --example gen-crds`; `ipam/tests/crd_drift.rs` fails when the committed files differ.

use std::path::PathBuf;

use ipam::store::kubernetes::crd;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args_os().nth(1).map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds"),
        PathBuf::from,
    );
    std::fs::create_dir_all(&dir)?;
    for (file, text) in crd::definition_files()? {
        let path = dir.join(file);
        std::fs::write(&path, text)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
