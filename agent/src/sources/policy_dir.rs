//! The policy directory (standalone mode: NetworkPolicies, Namespaces, Pods and Nodes as YAML) as a
//! source of the loop.
//!
//! A file written in place (truncate, then write) can be read half-written. So a change is read
//! until two consecutive reads agree (the directory settled), and a file that was non-empty and
//! reads empty must stay empty for a longer settle before it counts. Operators should still
//! replace files atomically (write a temporary file, rename it into place).

use std::{path::Path, time::Duration};

use crate::{
    applier::{Command, LoopHandle},
    policy::{
        last_good,
        load::{self, Fingerprint, Loaded},
    },
};

/// How often the directory is stat'ed.
const POLL: Duration = Duration::from_millis(50);
/// The gap between two reads that must agree.
const SETTLE: Duration = Duration::from_millis(20);
/// The gap when a non-empty file reads empty (a truncate before its write).
const SETTLE_EMPTIED: Duration = Duration::from_millis(250);
/// Reads before the latest is taken even if the directory keeps changing.
const MAX_READS: usize = 20;

/// True when a file that was non-empty in `before` is empty in `now`.
fn emptied(before: &Fingerprint, now: &Fingerprint) -> bool {
    now.iter()
        .any(|(path, _, len)| *len == 0 && before.iter().any(|(p, _, l)| p == path && *l > 0))
}

/// Reads the directory until two consecutive reads agree (bounded by `MAX_READS`).
async fn settled_read(dir: &Path, before: &Fingerprint) -> (Loaded, Fingerprint) {
    let mut fingerprint = load::fingerprint(dir);
    let mut loaded = load::load_dir_full(dir);
    for _ in 0..MAX_READS {
        let gap = if emptied(before, &fingerprint) {
            SETTLE_EMPTIED
        } else {
            SETTLE
        };
        tokio::time::sleep(gap).await;
        let again_fingerprint = load::fingerprint(dir);
        let again = load::load_dir_full(dir);
        let same = again == loaded && again_fingerprint == fingerprint;
        loaded = again;
        fingerprint = again_fingerprint;
        if same {
            break;
        }
    }
    (loaded, fingerprint)
}

/// Logs the caveats (`policy::warnings`) of `now` that `last` did not have, with file and line.
fn log_new_warnings(now: &Loaded, last: &Loaded) {
    for w in now.warnings.iter().filter(|w| !last.warnings.contains(w)) {
        tracing::warn!(warning = %w, "a policy directory document applies with a caveat");
    }
}

/// Logs every caveat of a first read of the directory (the agent's start).
fn log_warnings(loaded: &Loaded) {
    log_new_warnings(loaded, &Loaded::default());
}

/// The policy directory as a source of the loop: re-read when its fingerprint changes (a cheap
/// stat every 50 ms). Every valid document applies; a bad one is reported (file:line) and the
/// object it meant keeps its last good form (`policy::last_good`).
pub async fn run(dataplane_loop: LoopHandle, dir: std::path::PathBuf) {
    let mut seen = load::fingerprint(&dir);
    let mut last = load::load_dir_full(&dir);
    log_warnings(&last);
    loop {
        tokio::time::sleep(POLL).await;
        let now = load::fingerprint(&dir);
        if now == seen {
            continue;
        }
        let (loaded, fingerprint) = settled_read(&dir, &seen).await;
        seen = fingerprint;
        log_new_warnings(&loaded, &last);
        let merged = last_good::merge(loaded, &last);
        let command = Command::Policies {
            set: merged.set.clone(),
            errors: merged.errors.clone(),
        };
        last = merged;
        if dataplane_loop.send(command).is_err() {
            return;
        }
    }
}
