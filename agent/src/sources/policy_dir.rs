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
//!
//! The source wakes on the directory's inotify events as well as on its poll (the backstop: events
//! can be lost to an overflow, or the directory replaced). A file that arrived by rename
//! (`IN_MOVED_TO`) is whole, so a change is read at once, without the settle, when every file it
//! changed arrived by rename with no write, create or attribute event since the last read, the
//! queue did not overflow, and the fingerprint is the same after the read as before it. The
//! events are drained after the read's second fingerprint, so an in-place write the read could
//! have seen is always among them; anything else takes the settled path above.

use std::{
    collections::BTreeSet,
    ffi::OsString,
    io,
    path::Path,
    time::{Duration, Instant, SystemTime},
};

use inotify::{EventMask, Inotify, WatchMask};
use tokio::io::unix::AsyncFd;

use crate::{
    calc::policy::{
        last_good,
        load::{self, Fingerprint, Loaded},
        load_cache::DirCache,
    },
    control::applier::{Command, LoopHandle},
};

/// How often the directory is stat'ed (the backstop when events are on).
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

/// The directory's inotify events since the last read that counted (see the module's
/// documentation).
struct Events {
    fd: AsyncFd<Inotify>,
    buf: Vec<u8>,
    /// Names that arrived by rename.
    renamed: BTreeSet<OsString>,
    /// Names written, created or touched in place.
    written: BTreeSet<OsString>,
    /// An overflow or a read error: events may be missing.
    lost: bool,
    /// The watch is gone (the directory removed or moved): poll only until it is set up again.
    broken: bool,
}

impl Events {
    /// Watches `dir`; `None` (logged) when inotify is not to be had: the poll alone then.
    fn watch(dir: &Path) -> Option<Self> {
        let set_up = || -> io::Result<Self> {
            let inotify = Inotify::init()?;
            inotify.watches().add(
                dir,
                WatchMask::MOVED_TO
                    | WatchMask::MOVED_FROM
                    | WatchMask::CREATE
                    | WatchMask::MODIFY
                    | WatchMask::CLOSE_WRITE
                    | WatchMask::ATTRIB
                    | WatchMask::DELETE
                    | WatchMask::DELETE_SELF
                    | WatchMask::MOVE_SELF,
            )?;
            // SAFETY: `Inotify` owns its descriptor and keeps it open and unchanged until it is
            // dropped (with the `AsyncFd`); nothing here closes or replaces it.
            let fd = unsafe { AsyncFd::register(inotify) }.map_err(io::Error::from)?;
            Ok(Self {
                fd,
                buf: vec![0; 4096],
                renamed: BTreeSet::new(),
                written: BTreeSet::new(),
                lost: false,
                broken: false,
            })
        };
        match set_up() {
            Ok(events) => Some(events),
            Err(error) => {
                tracing::warn!(
                    %error,
                    dir = %dir.display(),
                    "cannot watch the policy directory for events; polling it only"
                );
                None
            }
        }
    }

    /// Waits until events are queued (forever when the watch is broken: the poll wakes then).
    async fn ready(&self) {
        if self.broken {
            return std::future::pending().await;
        }
        match self.fd.readable().await {
            Ok(mut guard) => guard.clear_ready(),
            Err(_) => std::future::pending().await,
        }
    }

    /// Reads every queued event (non-blocking: all that the kernel queued before this call).
    fn drain(&mut self) {
        loop {
            let events = match self.fd.get_mut().read_events(&mut self.buf) {
                Ok(events) => events,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(error) => {
                    tracing::debug!(%error, "policy directory events unreadable");
                    self.lost = true;
                    return;
                }
            };
            let mut any = false;
            for event in events {
                any = true;
                if event.mask.contains(EventMask::Q_OVERFLOW) {
                    self.lost = true;
                }
                if event
                    .mask
                    .intersects(EventMask::IGNORED | EventMask::DELETE_SELF | EventMask::MOVE_SELF)
                {
                    self.lost = true;
                    self.broken = true;
                }
                let Some(name) = event.name else { continue };
                if event.mask.contains(EventMask::MOVED_TO) {
                    self.renamed.insert(name.to_owned());
                }
                if event.mask.intersects(
                    EventMask::CREATE
                        | EventMask::MODIFY
                        | EventMask::CLOSE_WRITE
                        | EventMask::ATTRIB,
                ) {
                    self.written.insert(name.to_owned());
                }
            }
            if !any {
                return;
            }
        }
    }

    /// True when every file changed from `before` to `now` arrived by rename and nothing was
    /// written in place or lost since the last read that counted.
    fn all_renamed(&self, before: &Fingerprint, now: &Fingerprint) -> bool {
        !self.lost
            && now
                .iter()
                .filter(|entry| !before.contains(entry))
                .all(|(path, _, _)| {
                    path.file_name().is_some_and(|name| {
                        self.renamed.contains(name) && !self.written.contains(name)
                    })
                })
    }

    /// Forgets the events (a read counted).
    fn clear(&mut self) {
        self.renamed.clear();
        self.written.clear();
        self.lost = false;
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
/// fingerprint changes (on an inotify event, or a cheap stat every 50 ms). Every valid document
/// applies; a bad one is reported (file:line) and the object it meant keeps its last good form
/// (`policy::last_good`).
pub async fn run(dataplane_loop: LoopHandle, dir: std::path::PathBuf, first: FirstRead) {
    run_polling(
        |command| dataplane_loop.send(command).is_ok(),
        dir,
        first,
        POLL,
    )
    .await;
}

/// [`run`] with the poll's interval given (tests make it huge to see the events alone work),
/// handing each command to `send` until it returns false (the loop stopped).
async fn run_polling(
    mut send: impl FnMut(Command) -> bool,
    dir: std::path::PathBuf,
    first: FirstRead,
    poll: Duration,
) {
    let FirstRead {
        mut cache,
        fingerprint: mut seen,
        loaded: mut last,
    } = first;
    log_warnings(&last);
    let mut events = Events::watch(&dir);
    loop {
        match &events {
            Some(watch) => {
                tokio::select! {
                    () = tokio::time::sleep(poll) => {}
                    () = watch.ready() => {}
                }
            }
            None => tokio::time::sleep(poll).await,
        }
        if events.as_ref().is_some_and(|e| e.broken) {
            // The directory was removed or replaced: watch it again (the poll covers the gap).
            events = Events::watch(&dir);
            if let Some(watch) = &mut events {
                watch.lost = true;
            }
        }
        let now = load::fingerprint(&dir);
        if now == seen {
            if let Some(watch) = &mut events {
                watch.drain();
            }
            continue;
        }
        let settled = match fast_read(&dir, &seen, &now, &mut cache, events.as_mut()) {
            Some(settled) => settled,
            None => settled_read(&dir, &seen, &mut cache).await,
        };
        tracing::debug!(reads = settled.reads, dir = %dir.display(), "policy directory re-read");
        seen = settled.fingerprint;
        log_new_warnings(&settled.loaded, &last);
        let merged = last_good::merge(settled.loaded, &last);
        let command = Command::Policies {
            set: merged.set.clone(),
            errors: merged.errors.clone(),
        };
        last = merged;
        if !send(command) {
            return;
        }
    }
}

/// The read without the settle when every change arrived by rename (see the module's
/// documentation); `None` when the settled read must decide. The events are drained after the
/// read's second fingerprint and forgotten either way (the settled read needs none of them).
fn fast_read(
    dir: &Path,
    before: &Fingerprint,
    now: &Fingerprint,
    cache: &mut DirCache,
    events: Option<&mut Events>,
) -> Option<Settled> {
    let events = events?;
    let loaded = cache.load(dir);
    let after = load::fingerprint(dir);
    events.drain();
    let whole = after == *now && events.all_renamed(before, now);
    events.clear();
    whole.then_some(Settled {
        loaded,
        fingerprint: after,
        reads: 1,
    })
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

    /// A file renamed into the directory reaches the loop on its event alone: the poll is an hour
    /// away. (The first rename may come before the source's watch is set up: renames repeat until
    /// one arrives, within 10 s.)
    #[tokio::test]
    async fn a_renamed_in_file_is_applied_without_the_poll() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = first_read(dir.path());
        assert!(
            first.loaded.set.policies.is_empty(),
            "the directory starts empty"
        );
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let source = tokio::spawn(run_polling(
            move |command| tx.send(command).is_ok(),
            dir.path().to_owned(),
            first,
            Duration::from_secs(3600),
        ));
        let staged = dir.path().join(".p.yaml.tmp");
        let file = dir.path().join("p.yaml");
        let mut arrived = None;
        for round in 0..50 {
            fs::write(&staged, POLICY.replace("web", &format!("web{round}"))).expect("stage");
            fs::rename(&staged, &file).expect("rename into place");
            match tokio::time::timeout(Duration::from_millis(200), rx.recv()).await {
                Ok(Some(Command::Policies { set, .. })) => {
                    arrived = Some((round, set.policies.keys().cloned().collect::<Vec<_>>()));
                    break;
                }
                Ok(_) => panic!("the source stopped or sent another command"),
                Err(_) => {}
            }
        }
        source.abort();
        let (round, policies) = arrived.expect("a renamed-in file reaches the loop without a poll");
        assert_eq!(
            policies,
            vec![("default".to_owned(), format!("web{round}"))]
        );
    }

    /// A change that arrived by rename is read at once; a write in place after it is not (it
    /// takes the settled read), nor is any change once events were lost.
    #[tokio::test]
    async fn only_a_renamed_in_change_skips_the_settle() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut events = Events::watch(dir.path()).expect("inotify on a temporary directory");
        let mut cache = DirCache::default();
        let staged = dir.path().join(".p.yaml.tmp");
        let file = dir.path().join("p.yaml");

        let before = load::fingerprint(dir.path());
        fs::write(&staged, POLICY).expect("stage");
        fs::rename(&staged, &file).expect("rename into place");
        let now = load::fingerprint(dir.path());
        let read = fast_read(dir.path(), &before, &now, &mut cache, Some(&mut events))
            .expect("a renamed-in file is read without the settle");
        assert_eq!(policies(&read), web());
        assert_eq!(read.fingerprint, now);

        let before = now;
        fs::write(&file, POLICY.replace("web", "api")).expect("write in place");
        let now = load::fingerprint(dir.path());
        assert_ne!(now, before, "the write changed the fingerprint");
        assert!(
            fast_read(dir.path(), &before, &now, &mut cache, Some(&mut events)).is_none(),
            "a write in place must take the settled read"
        );

        let before = now;
        fs::write(&staged, POLICY).expect("stage");
        fs::rename(&staged, &file).expect("rename into place");
        events.lost = true;
        let now = load::fingerprint(dir.path());
        assert!(
            fast_read(dir.path(), &before, &now, &mut cache, Some(&mut events)).is_none(),
            "with events lost, a rename takes the settled read"
        );
        assert!(
            fast_read(dir.path(), &before, &now, &mut cache, None).is_none(),
            "without events, every change takes the settled read"
        );
    }
}
