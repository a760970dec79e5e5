//! The endpoint registry: every endpoint the CNI registered, persisted in the state directory
//! (`endpoints.json`, written atomically: temp file, fsync, rename) and restored on restart before
//! anything may be swept or released.

use std::{
    collections::BTreeMap,
    fs, io,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

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
}

/// The registry, backed by one file.
pub struct Registry {
    path: PathBuf,
    file: File,
}

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
        Ok(Self {
            path: path.to_owned(),
            file,
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
        if let Err(e) = self.persist() {
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
        if let Err(e) = self.persist() {
            self.file.endpoints.insert(key.to_owned(), removed);
            return Err(e);
        }
        Ok(Some(removed))
    }

    fn persist(&self) -> Result<(), RegistryError> {
        let bytes = serde_json::to_vec(&self.file).map_err(|e| RegistryError::Io {
            op: "serialise",
            path: self.path.clone(),
            source: io::Error::other(e),
        })?;
        crate::fsutil::write_atomic(&self.path, &bytes).map_err(|source| RegistryError::Io {
            op: "write",
            path: self.path.clone(),
            source,
        })
    }
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
