//! Failpoints for the crash tests: `WEIR_FAILPOINT=<name>` kills the process with `SIGKILL` (as
//! `kill -9` would) when it reaches that point. Names: `ct-migrate:mid-copy`,
//! `ct-migrate:after-copy`, `ct-migrate:after-rename`, `ct-migrate:after-links`,
//! `ct-migrate:after-delta`, `ct-rollback:after-copy`, `ct-rollback:after-rename`.

/// The environment variable naming the failpoint.
pub const ENV: &str = "WEIR_FAILPOINT";

/// Every failpoint, for validation and documentation.
pub const ALL: &[&str] = &[
    "ct-migrate:mid-copy",
    "ct-migrate:after-copy",
    "ct-migrate:after-rename",
    "ct-migrate:after-links",
    "ct-migrate:after-delta",
    "ct-rollback:after-copy",
    "ct-rollback:after-rename",
];

/// Kills the process if `WEIR_FAILPOINT` names `name`.
pub fn hit(name: &str) {
    if std::env::var(ENV).is_ok_and(|v| v == name) {
        tracing::warn!(failpoint = name, "failpoint reached: killing the process");
        // SIGKILL cannot be caught: nothing runs after this, as after `kill -9`.
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
        std::process::abort();
    }
}

/// `WEIR_FAILPOINT` names no failpoint.
#[derive(Debug, thiserror::Error)]
#[error("{ENV}={name} names no failpoint; use one of {}", ALL.join(", "))]
pub struct UnknownFailpoint {
    /// What it names.
    pub name: String,
}

/// An error naming the failpoint if `WEIR_FAILPOINT` is set to an unknown one.
pub fn validate() -> Result<(), UnknownFailpoint> {
    match std::env::var(ENV) {
        Ok(name) if !ALL.contains(&name.as_str()) => Err(UnknownFailpoint { name }),
        _ => Ok(()),
    }
}
