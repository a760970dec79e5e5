//! The endpoint registry: every endpoint the CNI registered, persisted in the state directory and
//! restored on restart before anything may be swept or released.
//!
//! Persistence is a base file, `endpoints.json` (written atomically: temp file, fsync, rename,
//! directory fsync), and its journal, `endpoints.json.journal` (`sources::journal`): a change is
//! one record appended and synced before the caller is answered, so a label change costs a
//! fraction of a millisecond instead of a rewrite of every endpoint. The first change after a
//! load, and any change that no longer fits in the journal, compacts: the base is rewritten with
//! the whole state under a new token, then an empty journal for that token replaces the old one.
//! The crash cases (a torn append, a crash between the two steps of a compaction, a failed
//! append) are argued in `sources::journal`; in each one a load finds every acknowledged change
//! and none that was refused. A base written by hand (tests, an older agent) names no journal,
//! so a journal left beside it is ignored.

use std::{
    collections::BTreeMap,
    fs, io,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use super::journal::{self, Journal};

/// Errors of the registry.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// Reading or writing the file failed.
    #[error("cannot {op} the endpoint registry {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A complete journal record does not parse (a torn last record is dropped, not this).
    #[error(
        "the endpoint registry journal {path} has a corrupt record ({source}); move the journal aside to start from the base file alone (changes recorded only there are lost; the CNI re-registers endpoints on the next pod sandbox change)"
    )]
    CorruptJournal {
        /// The journal.
        path: PathBuf,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// The file does not parse.
    #[error(
        "the endpoint registry {path} is corrupt ({source}); restore it from a backup or move it aside to start empty (endpoints will be re-registered by the CNI on the next pod sandbox change)"
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// A request names an invalid endpoint field.
    #[error("invalid endpoint: {field} {value:?} {rule}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// Its value.
        value: String,
        /// What it must be.
        rule: &'static str,
    },
    /// A request gives an endpoint more addresses than its map entry holds.
    #[error(
        "invalid endpoint: an endpoint has at most {max} addresses per family (got {v4} IPv4, {v6} IPv6)"
    )]
    TooManyAddresses {
        /// The limit per family.
        max: usize,
        /// IPv4 addresses given.
        v4: usize,
        /// IPv6 addresses given.
        v6: usize,
    },
}

/// An endpoint: one workload interface, as the API answers it and as the registry persists it
/// (the API contract's type), and its key `<container_id>:<ifname>`.
pub use weir_api::{Endpoint, endpoint_key as key};

#[derive(Default, Serialize, Deserialize)]
struct File {
    next_id: u32,
    endpoints: BTreeMap<String, Endpoint>,
    /// The token of the journal that continues this base (none: no journal applies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    journal: Option<u64>,
}

/// One change, as the journal records it.
#[derive(Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
enum Record {
    /// The endpoint stored under its key, and the next id after it.
    Upsert {
        endpoint: Box<Endpoint>,
        next_id: u32,
    },
    /// The endpoint under `key` removed.
    Remove { key: String },
}

/// The registry, backed by a base file and its journal.
pub struct Registry {
    path: PathBuf,
    file: File,
    /// The journal appends go to; none until the first change compacts (or after a failed
    /// append, so that nothing follows a partial record).
    journal: Option<Journal>,
    /// Room for records in a new journal (at least the base's size).
    journal_room: u64,
}

/// Room for records in a new journal: at least 1 MiB (about 3,000 changes), and as much as the
/// base, so compactions cost a bounded share of the writes at any size.
const MIN_JOURNAL: u64 = 1 << 20;

/// First endpoint id handed out (0 is never an endpoint id).
const FIRST_ID: u32 = 1;

impl Registry {
    /// Loads the registry at `path` (an absent file is an empty registry).
    pub fn load(path: &Path) -> Result<Self, RegistryError> {
        let file = match fs::read(path) {
            Ok(bytes) => {
                serde_json::from_slice(&bytes).map_err(|source| RegistryError::Corrupt {
                    path: path.to_owned(),
                    source,
                })?
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => File {
                next_id: FIRST_ID,
                ..File::default()
            },
            Err(source) => {
                return Err(RegistryError::Io {
                    op: "read",
                    path: path.to_owned(),
                    source,
                });
            }
        };
        let mut file: File = file;
        if let Some(token) = file.journal {
            let journal = journal::path_of(path);
            let records = journal::read(&journal, token).map_err(|source| RegistryError::Io {
                op: "read",
                path: journal.clone(),
                source,
            })?;
            for line in records.into_iter().flatten() {
                let record = serde_json::from_slice(&line).map_err(|source| {
                    RegistryError::CorruptJournal {
                        path: journal.clone(),
                        source,
                    }
                })?;
                match record {
                    Record::Upsert { endpoint, next_id } => {
                        file.next_id = file.next_id.max(next_id);
                        file.endpoints.insert(endpoint.key(), *endpoint);
                    }
                    Record::Remove { key } => {
                        file.endpoints.remove(&key);
                    }
                }
            }
        }
        Ok(Self {
            path: path.to_owned(),
            file,
            journal: None,
            journal_room: MIN_JOURNAL,
        })
    }

    /// Every endpoint, by key.
    pub fn endpoints(&self) -> impl Iterator<Item = &Endpoint> {
        self.file.endpoints.values()
    }

    /// One endpoint.
    #[must_use]
    pub fn get(&self, key: &str) -> Option<&Endpoint> {
        self.file.endpoints.get(key)
    }

    /// Number of endpoints.
    #[must_use]
    pub fn len(&self) -> usize {
        self.file.endpoints.len()
    }

    /// True when empty.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.file.endpoints.is_empty()
    }

    /// Creates or replaces an endpoint (keeping the id of the one it replaces) and persists.
    /// Returns the stored endpoint.
    pub fn upsert(&mut self, mut endpoint: Endpoint) -> Result<Endpoint, RegistryError> {
        validate(&endpoint)?;
        let key = endpoint.key();
        endpoint.id = match self.file.endpoints.get(&key) {
            Some(existing) => existing.id,
            None => {
                let id = self.file.next_id.max(FIRST_ID);
                self.file.next_id = id + 1;
                id
            }
        };
        let previous = self.file.endpoints.insert(key.clone(), endpoint.clone());
        let record = Record::Upsert {
            endpoint: Box::new(endpoint.clone()),
            next_id: self.file.next_id,
        };
        if let Err(e) = self.persist(&record) {
            // Keep memory equal to the file: undo.
            match previous {
                Some(p) => self.file.endpoints.insert(key, p),
                None => self.file.endpoints.remove(&key),
            };
            return Err(e);
        }
        Ok(endpoint)
    }

    /// Removes an endpoint and persists; returns it if it existed.
    pub fn remove(&mut self, key: &str) -> Result<Option<Endpoint>, RegistryError> {
        let Some(removed) = self.file.endpoints.remove(key) else {
            return Ok(None);
        };
        let record = Record::Remove {
            key: key.to_owned(),
        };
        if let Err(e) = self.persist(&record) {
            self.file.endpoints.insert(key.to_owned(), removed);
            return Err(e);
        }
        Ok(Some(removed))
    }

    /// Makes the change in memory durable before the caller is answered: one journal record, or a
    /// compaction when there is no journal yet or the record does not fit.
    fn persist(&mut self, record: &Record) -> Result<(), RegistryError> {
        if let Some(journal) = &mut self.journal {
            let line = serde_json::to_vec(record).map_err(|e| RegistryError::Io {
                op: "serialise",
                path: self.path.clone(),
                source: io::Error::other(e),
            })?;
            let path = journal::path_of(&self.path);
            match journal.append(&line) {
                Ok(true) => {
                    crate::fsutil::note_success(&path);
                    return Ok(());
                }
                Ok(false) => {}
                Err(e) => {
                    // Part of the line may be on disk: the next change compacts (a new token).
                    self.journal = None;
                    let source = crate::fsutil::note_failure(&path, line.len(), &e);
                    return Err(RegistryError::Io {
                        op: "append to",
                        path,
                        source,
                    });
                }
            }
        }
        self.compact()
    }

    /// Rewrites the base with the whole state under a new token, then starts an empty journal
    /// for it (the order the crash cases in `sources::journal` rely on).
    fn compact(&mut self) -> Result<(), RegistryError> {
        self.journal = None;
        let previous = self.file.journal.replace(new_token());
        let bytes = serde_json::to_vec(&self.file).map_err(|e| RegistryError::Io {
            op: "serialise",
            path: self.path.clone(),
            source: io::Error::other(e),
        });
        let written = bytes.and_then(|bytes| {
            crate::fsutil::write_state(&self.path, &bytes)
                .map(|()| bytes.len())
                .map_err(|source| RegistryError::Io {
                    op: "write",
                    path: self.path.clone(),
                    source,
                })
        });
        let base_len = match written {
            Ok(len) => len as u64,
            Err(e) => {
                self.file.journal = previous;
                return Err(e);
            }
        };
        let path = journal::path_of(&self.path);
        let token = self.file.journal.unwrap_or_default();
        match Journal::create(&path, token, base_len.max(self.journal_room)) {
            Ok(journal) => self.journal = Some(journal),
            // The base alone holds the change; the next change compacts again.
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot start the endpoint registry journal; every change rewrites the registry until it can");
            }
        }
        Ok(())
    }
}

/// A token no earlier base of this registry is likely to have named: the time and a per-process
/// random hash, mixed.
fn new_token() -> u64 {
    use std::hash::{BuildHasher as _, Hasher as _};
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(nanos);
    hasher.write_u32(std::process::id());
    hasher.finish()
}

fn validate(endpoint: &Endpoint) -> Result<(), RegistryError> {
    let bad = |field, value: &str, rule| {
        Err(RegistryError::Invalid {
            field,
            value: value.to_owned(),
            rule,
        })
    };
    if endpoint.container_id.is_empty() || endpoint.container_id.contains(['/', ':', ' ']) {
        return bad(
            "container_id",
            &endpoint.container_id,
            "must be non-empty without '/', ':' or spaces",
        );
    }
    if endpoint.ifname.is_empty()
        || endpoint.ifname.len() > 15
        || endpoint.ifname.contains(['/', ':', ' '])
    {
        return bad(
            "ifname",
            &endpoint.ifname,
            "must be 1-15 characters without '/', ':' or spaces",
        );
    }
    if !endpoint
        .host_ifname
        .starts_with(maps_schema::programs::WORKLOAD_LINK_PREFIX)
        || endpoint.host_ifname.len() > 15
    {
        return bad(
            "host_ifname",
            &endpoint.host_ifname,
            "must start with \"weir\" and be at most 15 characters",
        );
    }
    let v4 = endpoint.ips.iter().filter(|ip| ip.is_ipv4()).count();
    let v6 = endpoint.ips.len() - v4;
    let max = maps_schema::endpoint::MAX_ADDRS_PER_FAMILY;
    if v4 > max || v6 > max {
        return Err(RegistryError::TooManyAddresses { max, v4, v6 });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(container: &str) -> Endpoint {
        Endpoint {
            id: 0,
            container_id: container.into(),
            ifname: "eth0".into(),
            host_ifname: "weir0123456789a".into(),
            netns: "/var/run/netns/x".into(),
            namespace: "default".into(),
            pod: "web".into(),
            labels: BTreeMap::from([("app".into(), "web".into())]),
            handle: format!("weir.{container}"),
            ips: vec!["10.244.0.5".parse().expect("ip")],
        }
    }

    #[test]
    fn endpoints_survive_a_reload_with_stable_ids() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("endpoints.json");
        let mut reg = Registry::load(&path).expect("empty");
        let a = reg.upsert(endpoint("a")).expect("a");
        let b = reg.upsert(endpoint("b")).expect("b");
        assert_ne!(a.id, b.id);
        let again = reg.upsert(endpoint("a")).expect("a again");
        assert_eq!(again.id, a.id, "replacing keeps the id");
        reg.remove(&b.key()).expect("remove");
        let reg = Registry::load(&path).expect("reload");
        assert_eq!(reg.len(), 1);
        assert_eq!(reg.get(&a.key()), Some(&a));
        let c = Registry::load(&path)
            .expect("reload")
            .upsert(endpoint("c"))
            .expect("c");
        assert!(c.id > b.id, "ids are never reused");
    }

    #[test]
    fn changes_go_to_the_journal_and_a_load_replays_them() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("endpoints.json");
        let mut reg = Registry::load(&path).expect("empty");
        let a = reg.upsert(endpoint("a")).expect("a");
        let base = fs::read(&path).expect("base");
        let mut relabelled = endpoint("a");
        relabelled.labels.insert("app".into(), "db".into());
        let relabelled = reg.upsert(relabelled).expect("relabel");
        let b = reg.upsert(endpoint("b")).expect("b");
        reg.remove(&a.key()).expect("remove a");
        let c = reg.upsert(endpoint("c")).expect("c");
        reg.upsert(endpoint("a")).expect("a again");
        assert_eq!(
            fs::read(&path).expect("base"),
            base,
            "only the journal was written"
        );
        let loaded = Registry::load(&path).expect("reload");
        let all: Vec<&Endpoint> = loaded.endpoints().collect();
        let again = loaded.get(&a.key()).expect("a is back");
        assert_eq!(all.len(), 3);
        assert_eq!(loaded.get(&b.key()), Some(&b));
        assert_eq!(loaded.get(&c.key()), Some(&c));
        assert!(
            again.id > c.id,
            "a removed endpoint comes back with a new id"
        );
        assert_ne!(relabelled.labels, again.labels);
        // The next change after a load compacts: the base alone holds everything.
        let mut reg = loaded;
        let d = reg.upsert(endpoint("d")).expect("d");
        fs::remove_file(super::journal::path_of(&path)).expect("drop the journal");
        let from_base = Registry::load(&path).expect("base only");
        assert_eq!(from_base.len(), 4);
        assert_eq!(from_base.get(&d.key()), Some(&d));
    }

    #[test]
    fn a_torn_last_record_is_dropped_and_a_corrupt_one_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("endpoints.json");
        let journal = super::journal::path_of(&path);
        let mut reg = Registry::load(&path).expect("empty");
        reg.upsert(endpoint("a")).expect("a");
        let b = reg.upsert(endpoint("b")).expect("b");
        let bytes = fs::read(&journal).expect("journal");
        let end = bytes.iter().position(|x| *x == 0).expect("end mark");
        // A crash in the middle of appending c's record: a prefix of its line is on disk.
        let line = serde_json::to_vec(&Record::Upsert {
            endpoint: Box::new(endpoint("c")),
            next_id: 9,
        })
        .expect("json");
        let mut torn = bytes.clone();
        torn[end..end + line.len() / 2].copy_from_slice(&line[..line.len() / 2]);
        fs::write(&journal, &torn).expect("torn");
        let loaded = Registry::load(&path).expect("a torn tail is not an error");
        assert_eq!(loaded.len(), 2);
        assert_eq!(loaded.get(&b.key()), Some(&b));
        // A complete line that does not parse is corruption, named as such.
        let mut corrupt = bytes;
        corrupt[end..end + 6].copy_from_slice(b"{oops\n");
        fs::write(&journal, &corrupt).expect("corrupt");
        let err = Registry::load(&path)
            .err()
            .expect("corrupt journal")
            .to_string();
        assert!(err.contains("journal") && err.contains("corrupt"), "{err}");
    }

    #[test]
    fn a_journal_of_another_base_is_ignored_and_a_full_one_compacts() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("endpoints.json");
        let mut reg = Registry::load(&path).expect("empty");
        reg.journal_room = 4096;
        reg.upsert(endpoint("a")).expect("a");
        for i in 0..40 {
            reg.upsert(endpoint(&format!("x{i}"))).expect("fill");
        }
        let loaded = Registry::load(&path).expect("reload");
        assert_eq!(loaded.len(), 41, "records past a compaction survive too");
        // A base written without a journal (by hand, or by an older agent): the journal left
        // beside it belongs to another base.
        fs::write(&path, br#"{"next_id": 5, "endpoints": {}}"#).expect("hand-written");
        let fresh = Registry::load(&path).expect("hand-written base");
        assert!(fresh.is_empty());
    }

    #[test]
    fn bad_input_is_rejected_and_nothing_changes() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("endpoints.json");
        let mut reg = Registry::load(&path).expect("empty");
        reg.upsert(endpoint("a")).expect("a");
        let mut bad = endpoint("b");
        bad.host_ifname = "eth0".into();
        assert!(matches!(
            reg.upsert(bad),
            Err(RegistryError::Invalid { .. })
        ));
        let mut bad = endpoint("c/d");
        bad.ips.clear();
        assert!(reg.upsert(bad).is_err());
        assert_eq!(Registry::load(&path).expect("reload").len(), 1);
        fs::write(&path, b"{not json").expect("corrupt");
        let err = Registry::load(&path)
            .err()
            .expect("corrupt file is an error")
            .to_string();
        assert!(err.contains("corrupt"), "{err}");
    }
}
