//! The policy directory (standalone mode: NetworkPolicies, Namespaces, Pods and Nodes as YAML) as a
//! source of the loop.
//!
//! A file written in place (truncate, then write) can be read half-written. So a change counts
//! only once the directory has been left alone for a while: its files' last change is at least
//! [`SETTLE`] old (or [`SETTLE_EMPTIED`] when a file that was non-empty reads empty: a truncate
//! before its write), and a read is taken between two fingerprints that agree (nothing changed
//! while it read). In the common case (the change is already that old when the poll notices it)
//! that is one read; otherwise the wait is the rest of the quiet period, stat-only, and a read
//! follows. A file whose time is missing or in the future (a skewed clock) counts as quiet once
//! this process has seen it unchanged for the whole period. Operators should still replace files
//! atomically (write a temporary file, rename it into place).

use std::{
    path::Path,
    time::{Duration, Instant, SystemTime},
};

use crate::{
    calc::policy::{
        last_good,
        load::{self, Fingerprint, Loaded},
        load_cache::DirCache,
    },
    control::applier::{Command, LoopHandle},
};

/// How often the directory is stat'ed.
const POLL: Duration = Duration::from_millis(50);
/// How long the files must have been left alone before a read counts.
const SETTLE: Duration = Duration::from_millis(20);
/// The same when a non-empty file reads empty (a truncate before its write).
const SETTLE_EMPTIED: Duration = Duration::from_millis(250);
/// Rounds (a wait or a read) before the latest read is taken even if the directory keeps
/// changing.
const MAX_ROUNDS: usize = 20;

/// True when a file that was non-empty in `before` is empty in `now`.
fn emptied(before: &Fingerprint, now: &Fingerprint) -> bool {
    now.iter()
        .any(|(path, _, len)| *len == 0 && before.iter().any(|(p, _, l)| p == path && *l > 0))
}

/// How long ago the newest change of `fingerprint` was, by the files' times: `None` when a time
/// is missing or in the future (only an observed wait can tell then).
fn quiet_for(fingerprint: &Fingerprint, now: SystemTime) -> Option<Duration> {
    fingerprint
        .iter()
        .try_fold(Duration::MAX, |newest, (_, modified, _)| {
            let age = now.duration_since((*modified)?).ok()?;
            Some(newest.min(age))
        })
}

/// A read that counts, and how many reads it took.
struct Settled {
    loaded: Loaded,
    fingerprint: Fingerprint,
    reads: usize,
}

/// Reads the directory once it has settled (see the module's documentation; bounded by
/// [`MAX_ROUNDS`]), parsing only the files that changed (`cache`). `before` is the fingerprint of
/// the last read that counted.
async fn settled_read(dir: &Path, before: &Fingerprint, cache: &mut DirCache) -> Settled {
    let mut fingerprint = load::fingerprint(dir);
    // Since when this process has seen `fingerprint` unchanged.
    let mut seen_since = Instant::now();
    let mut reads = 0;
    for _ in 0..MAX_ROUNDS {
        let quiet = if emptied(before, &fingerprint) {
            SETTLE_EMPTIED
        } else {
            SETTLE
        };
        let wait = match quiet_for(&fingerprint, SystemTime::now()) {
            Some(age) => quiet.saturating_sub(age),
            None => quiet.saturating_sub(seen_since.elapsed()),
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
            let now = load::fingerprint(dir);
            if now != fingerprint {
                fingerprint = now;
                seen_since = Instant::now();
            }
            continue;
        }
        let loaded = cache.load(dir);
        reads += 1;
        let after = load::fingerprint(dir);
        if after == fingerprint {
            return Settled {
                loaded,
                fingerprint,
                reads,
            };
        }
        // Changed while it read: wait for it to settle again.
        fingerprint = after;
        seen_since = Instant::now();
    }
    // Still changing: take the latest (the next poll sees any change after this fingerprint).
    let fingerprint = load::fingerprint(dir);
    Settled {
        loaded: cache.load(dir),
        fingerprint,
        reads: reads + 1,
    }
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

/// The directory's first read (the agent's start, before the loop's first write), which [`run`]
/// then follows from: its files' parses are kept, so the source does not parse them again.
#[derive(Debug)]
pub struct FirstRead {
    cache: DirCache,
    /// Taken before the read: a change during it is noticed by the first poll.
    fingerprint: Fingerprint,
    /// What the read found.
    pub loaded: Loaded,
}

/// Reads `dir` for the agent's start.
#[must_use]
pub fn first_read(dir: &Path) -> FirstRead {
    let mut cache = DirCache::default();
    let fingerprint = load::fingerprint(dir);
    let loaded = cache.load(dir);
    FirstRead {
        cache,
        fingerprint,
        loaded,
    }
}

/// The policy directory as a source of the loop, from its first read: re-read when its
/// fingerprint changes (a cheap stat every 50 ms). Every valid document applies; a bad one is
/// reported (file:line) and the object it meant keeps its last good form (`policy::last_good`).
pub async fn run(dataplane_loop: LoopHandle, dir: std::path::PathBuf, first: FirstRead) {
    let FirstRead {
        mut cache,
        fingerprint: mut seen,
        loaded: mut last,
    } = first;
    log_warnings(&last);
    loop {
        tokio::time::sleep(POLL).await;
        let now = load::fingerprint(&dir);
        if now == seen {
            continue;
        }
        let settled = settled_read(&dir, &seen, &mut cache).await;
        tracing::debug!(reads = settled.reads, dir = %dir.display(), "policy directory re-read");
        seen = settled.fingerprint;
        log_new_warnings(&settled.loaded, &last);
        let merged = last_good::merge(settled.loaded, &last);
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

#[cfg(test)]
mod tests {
    use std::{fs, time::Duration};

    use super::*;

    const POLICY: &str = "kind: NetworkPolicy\nmetadata: {name: web, namespace: default}\nspec:\n  podSelector: {}\n  ingress:\n  - ports: [{port: 80}]\n";

    fn policies(settled: &Settled) -> Vec<(String, String)> {
        settled.loaded.set.policies.keys().cloned().collect()
    }

    fn web() -> Vec<(String, String)> {
        vec![("default".to_owned(), "web".to_owned())]
    }

    /// Sets `file`'s modification time `ago` in the past (negative: in the future).
    fn touch(file: &Path, ago: Duration, future: bool) {
        let now = SystemTime::now();
        let at = if future { now + ago } else { now - ago };
        fs::File::options()
            .write(true)
            .open(file)
            .and_then(|f| f.set_modified(at))
            .expect("set the file's time");
    }

    #[tokio::test]
    async fn a_file_already_quiet_is_read_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("p.yaml");
        fs::write(&file, POLICY).expect("write");
        touch(&file, Duration::from_secs(1), false);
        let settled = settled_read(dir.path(), &Vec::new(), &mut DirCache::default()).await;
        assert_eq!(policies(&settled), web());
        assert_eq!(settled.reads, 1, "a settled directory needs one read");
        assert_eq!(settled.fingerprint, load::fingerprint(dir.path()));
    }

    #[tokio::test]
    async fn a_fresh_file_is_waited_for_then_read_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("p.yaml");
        fs::write(&file, POLICY).expect("write");
        let written = SystemTime::now();
        let settled = settled_read(dir.path(), &Vec::new(), &mut DirCache::default()).await;
        assert!(
            written.elapsed().unwrap_or_default() + Duration::from_millis(10) >= SETTLE,
            "read before the settle"
        );
        assert_eq!(policies(&settled), web());
        assert_eq!(settled.reads, 1);
    }

    #[tokio::test]
    async fn a_file_with_a_future_time_is_read_after_an_observed_wait() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("p.yaml");
        fs::write(&file, POLICY).expect("write");
        touch(&file, Duration::from_secs(3600), true);
        let started = Instant::now();
        let settled = settled_read(dir.path(), &Vec::new(), &mut DirCache::default()).await;
        assert!(
            started.elapsed() >= SETTLE,
            "read before an observed settle"
        );
        assert_eq!(policies(&settled), web());
        assert_eq!(settled.reads, 1);
    }

    /// Truncated, then written 50 ms later (in place, as an editor without atomic saves does):
    /// the empty file never counts.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_truncated_file_is_not_taken_as_empty() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("p.yaml");
        fs::write(&file, POLICY).expect("write");
        touch(&file, Duration::from_secs(1), false);
        let before = load::fingerprint(dir.path());
        fs::write(&file, "").expect("truncate");
        let writer = {
            let file = file.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                fs::write(&file, POLICY.replace("web", "api")).expect("write again");
            })
        };
        let settled = settled_read(dir.path(), &before, &mut DirCache::default()).await;
        writer.join().expect("writer");
        assert_eq!(
            policies(&settled),
            vec![("default".to_owned(), "api".to_owned())],
            "the read must see the rewritten file, not the truncated one"
        );
    }

    /// Positive control for the test above: a file that stays empty does count, after the
    /// longer settle.
    #[tokio::test]
    async fn a_file_left_empty_counts_after_the_longer_settle() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("p.yaml");
        fs::write(&file, POLICY).expect("write");
        touch(&file, Duration::from_secs(1), false);
        let before = load::fingerprint(dir.path());
        fs::write(&file, "").expect("truncate");
        let truncated = SystemTime::now();
        let settled = settled_read(dir.path(), &before, &mut DirCache::default()).await;
        assert!(
            truncated.elapsed().unwrap_or_default() + Duration::from_millis(10) >= SETTLE_EMPTIED
        );
        assert!(policies(&settled).is_empty());
        assert_eq!(settled.reads, 1);
    }
}
