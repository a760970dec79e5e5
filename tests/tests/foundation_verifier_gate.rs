//! Verifier gate: every program in weir's object loads into the real kernel, the object's maps and
//! programs are exactly the ones `maps-schema` names, and the gate fails on a rejected program.

use agent::kernel::real::loader::{self, LoadError};
use tests::{bpf::PinRoot, privileged::require_root};

#[test]
fn verifier_gate() {
    if !require_root("verifier_gate") {
        return;
    }
    // Positive: weir's own object passes, and its maps and programs match maps-schema.
    let root = PinRoot::new();
    let ebpf = tests::bpf::load_weir(&root);
    let mut programs: Vec<&str> = ebpf.programs().map(|(name, _)| name).collect();
    programs.sort_unstable();
    let mut expected: Vec<&str> = maps_schema::programs::ALL.to_vec();
    expected.sort_unstable();
    assert_eq!(
        programs, expected,
        "the object's programs differ from maps_schema::programs::ALL"
    );
    let mut maps: Vec<&str> = ebpf.maps().map(|(name, _)| name).collect();
    maps.sort_unstable();
    let mut expected: Vec<&str> = maps_schema::maps::ALL.to_vec();
    expected.sort_unstable();
    assert_eq!(
        maps, expected,
        "the object's maps differ from maps_schema::maps::ALL"
    );
    drop(ebpf);

    // Negative control: an object with a program the verifier rejects fails the gate, naming it.
    let rejected =
        std::fs::read(env!("WEIR_TEST_OBJECT_VERIFIER_REJECT")).expect("variant object exists");
    let root = PinRoot::new();
    match loader::load_object(&rejected, &root.paths().maps_dir()) {
        Err(LoadError::Program {
            program,
            verifier_log,
            ..
        }) => {
            assert_eq!(program, "wt_rejected");
            assert!(
                !verifier_log.is_empty(),
                "the gate reports the verifier log"
            );
        }
        Err(other) => panic!("expected a verifier rejection of wt_rejected, got: {other}"),
        Ok(_) => panic!("an object with an out-of-bounds packet read passed the verifier gate"),
    }
}
