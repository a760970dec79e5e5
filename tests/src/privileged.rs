//! Privileged tests run as root. Under `CI=true` a privileged test that cannot run fails; elsewhere
//! it says why it skips.

/// True when the test may touch the kernel. Panics under `CI` when it cannot.
#[must_use]
pub fn require_root(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{test}: privileged test cannot run without root, and CI is set: run the suite as root"
    );
    eprintln!("skipping test {test} - needs root (set CI=true to make this a failure)");
    false
}
