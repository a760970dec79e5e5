//! The Kubernetes store: one custom resource per [`Kind`] in group `ipam.weir.dev` (see [`crd`]), compare-and-swap
//! by `resourceVersion`.
//!
//! - **Names.** A store name that is a valid object name is used as it is; any other (an affinity's
//!   `<host>/<block>`, a handle with upper case or `_`) becomes a lower-case, `-`-joined form plus `-` and 16 hex
//!   digits of its FNV-1a hash. The store name is kept in the annotation `ipam.weir.dev/name` and checked on read.
//! - **Per-host lookups.** Affinities and blocks carry the label `ipam.weir.dev/host` = 16 hex digits of the
//!   FNV-1a hash of the host they belong to (host names may be longer than a label value may be). Listing a
//!   host's affinities, the hot path's only list besides config, pools and reservations, is a label-selector
//!   list; the names are then filtered by prefix, so a hash collision costs a few rows, never a wrong answer.
//! - **Compare-and-swap.** Create is a POST (409 `AlreadyExists` → [`StoreError::Conflict`]); update is a PUT
//!   carrying the resourceVersion read (409 `Conflict` → conflict; 404 → conflict); delete is a DELETE with a
//!   `resourceVersion` precondition. A resourceVersion must be a decimal number (it is on every etcd-backed API
//!   server; the conventions call it opaque, so anything else is reported).
//! - **Soft delete.** As in every backend, objects carry `deleted` in their spec and the allocator skips them;
//!   objects that the API server is finalizing (`deletionTimestamp` set) are skipped by listings too.
//! - **No multi-object transactions.** A transaction's writes are made one by one, each compare-and-swap, in the
//!   order of its keys. The hot path (`[block, handle]`) therefore writes the block first, then the handle: the
//!   block is the truth for which address is whose. When the handle write loses a race after the block write
//!   won, [`read_modify_write`](Store::read_modify_write) rolls forward: it re-reads only the keys not yet
//!   written, re-runs the decision with the values the written keys were decided on, and writes the rest,
//!   provided the decision for the written keys is unchanged (otherwise [`StoreError::Torn`]). A crash between
//!   the two writes leaves a block whose allocation names a handle that does not count it; `weir ipam check`
//!   reports it ("handle … records N addresses in block … but the block holds M") and `weir ipam check --repair`
//!   rebuilds handle counts from the blocks.

use std::collections::BTreeMap;

use kube::{
    Client,
    api::{Api, DeleteParams, DynamicObject, ListParams, PostParams, Preconditions},
};

use super::{Key, Kind, Op, RMW_RETRIES, Revision, Store, StoreError, Versioned, Write, plan_ops};
use crate::cidr::fnv1a;

pub mod crd;

/// The annotation holding an object's store name.
pub const NAME_ANNOTATION: &str = "ipam.weir.dev/name";
/// The label holding the hash of the host an affinity or block belongs to.
pub const HOST_LABEL: &str = "ipam.weir.dev/host";

/// The verbs this store uses, as RBAC names them: `get` and `list` (reads and label-selector
/// listings), `create` (POST), `update` (PUT with a resourceVersion) and `delete` (with a
/// precondition). No `watch`, no `patch`. The deployment's ClusterRole (`deploy/weir.yaml`) grants
/// exactly these on [`rbac_resources`]; the contract tests check every request the store makes
/// against this list, and the manifest tests check the ClusterRole against it.
pub const RBAC_VERBS: &[&str] = &["get", "list", "create", "update", "delete"];

/// The resources (plurals of group [`crd::GROUP`]) this store reads and writes: one per [`Kind`].
pub fn rbac_resources() -> Vec<String> {
    Kind::ALL
        .iter()
        .map(|k| crd::api_resource(*k).plural)
        .collect()
}

/// Page size of listings.
const PAGE: u32 = 500;

/// An API server reached through kube-rs.
#[derive(Clone)]
pub struct KubeStore {
    apis: BTreeMap<Kind, Api<DynamicObject>>,
    location: String,
}

impl std::fmt::Debug for KubeStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeStore")
            .field("location", &self.location)
            .finish()
    }
}

/// The label value for `host`: 16 hex digits of its FNV-1a hash.
pub fn host_hash(host: &str) -> String {
    format!("{:016x}", fnv1a(host))
}

fn is_object_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        })
}

/// The object name that stores the store name `name`.
pub fn object_name(name: &str) -> String {
    if is_object_name(name) {
        return name.to_owned();
    }
    let mut s: String = name
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '-'
            }
        })
        .collect();
    s.truncate(200);
    let s = s.trim_matches('-');
    let hash = format!("{:016x}", fnv1a(name));
    if s.is_empty() {
        format!("x-{hash}")
    } else {
        format!("{s}-{hash}")
    }
}

/// The host whose hash labels the object, if any.
fn owning_host<'a>(key: &'a Key, spec: &'a serde_json::Value) -> Option<&'a str> {
    match key.kind {
        Kind::Affinity => spec
            .get("host")
            .and_then(serde_json::Value::as_str)
            .or_else(|| key.name.split_once('/').map(|(h, _)| h)),
        Kind::Block => spec
            .get("affinity")
            .and_then(serde_json::Value::as_str)
            .and_then(|a| a.strip_prefix("host:")),
        _ => None,
    }
}

/// What went wrong with one write, and how many of a transaction's operations were done before it.
struct Failed {
    at: usize,
    error: StoreError,
}

impl KubeStore {
    /// Connects with the in-cluster service account or the kubeconfig (`KUBECONFIG`, `~/.kube/config`) and
    /// checks that the API server answers and serves the `ipam.weir.dev` resources.
    pub async fn connect() -> Result<Self, StoreError> {
        let client = Client::try_default()
            .await
            .map_err(|e| StoreError::Unavailable {
                backend: "kubernetes",
                location: "in-cluster config or kubeconfig".into(),
                detail: "no usable Kubernetes client configuration: run inside a pod with a service account, or \
                         set KUBECONFIG (or ~/.kube/config) to a cluster"
                    .into(),
                source: Some(Box::new(e)),
            })?;
        let store = Self::new(client);
        let api = store.api(Kind::Pool);
        api.list(&ListParams::default().limit(1))
            .await
            .map_err(|e| match e {
                kube::Error::Api(s) if s.is_not_found() => StoreError::Unavailable {
                    backend: "kubernetes",
                    location: store.location.clone(),
                    detail: "the API server does not serve ippools.ipam.weir.dev: install the CRDs with \
                             `kubectl apply -f deploy/crds/`"
                        .into(),
                    source: Some(Box::new(kube::Error::Api(s))),
                },
                e => store.unavailable(e),
            })?;
        Ok(store)
    }

    /// A store over `client` (any tower service: a real cluster, or a mock in tests).
    pub fn new(client: Client) -> Self {
        let apis = Kind::ALL
            .iter()
            .map(|k| (*k, Api::all_with(client.clone(), &crd::api_resource(*k))))
            .collect();
        Self {
            apis,
            location: format!("{} API group", crd::GROUP),
        }
    }

    fn api(&self, kind: Kind) -> &Api<DynamicObject> {
        // Every kind is inserted in `new`.
        &self.apis[&kind]
    }

    fn unavailable(&self, e: kube::Error) -> StoreError {
        StoreError::Unavailable {
            backend: "kubernetes",
            location: self.location.clone(),
            detail: "request failed: check that the API server is reachable, that the CRDs from deploy/crds/ are \
                     installed, and that this identity may read and write them"
                .into(),
            source: Some(Box::new(e)),
        }
    }

    /// Maps an API error of a write on `key`: a lost compare-and-swap (409, or 404 for an object that went away)
    /// is a conflict; anything else is reported.
    fn write_error(&self, key: &Key, e: kube::Error) -> StoreError {
        match e {
            kube::Error::Api(s) if s.is_conflict() || s.is_already_exists() || s.is_not_found() => {
                StoreError::Conflict {
                    key: key.to_string(),
                }
            }
            e => self.unavailable(e),
        }
    }

    fn object(
        &self,
        key: &Key,
        value: &[u8],
        revision: Option<Revision>,
    ) -> Result<DynamicObject, StoreError> {
        let spec: serde_json::Value =
            serde_json::from_slice(value).map_err(|source| StoreError::Corrupt {
                key: key.to_string(),
                source,
            })?;
        let mut obj = DynamicObject::new(&object_name(&key.name), &crd::api_resource(key.kind));
        if let Some(host) = owning_host(key, &spec) {
            obj.metadata.labels = Some(BTreeMap::from([(HOST_LABEL.to_owned(), host_hash(host))]));
        }
        obj.metadata.annotations = Some(BTreeMap::from([(
            NAME_ANNOTATION.to_owned(),
            key.name.clone(),
        )]));
        obj.metadata.resource_version = revision.map(|r| r.0.to_string());
        obj.data = serde_json::json!({ "spec": spec });
        Ok(obj)
    }

    /// The store name and stored value of an object.
    fn versioned(
        &self,
        kind: Kind,
        obj: &DynamicObject,
    ) -> Result<(String, Versioned), StoreError> {
        let name = obj
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(NAME_ANNOTATION))
            .cloned()
            .or_else(|| obj.metadata.name.clone())
            .unwrap_or_default();
        let key = Key::new(kind, name.clone());
        let spec = obj.data.get("spec").ok_or_else(|| StoreError::Corrupt {
            key: key.to_string(),
            source: serde::de::Error::custom("the object has no spec"),
        })?;
        let value = serde_json::to_vec(spec).map_err(|source| StoreError::Corrupt {
            key: key.to_string(),
            source,
        })?;
        let rv = obj.metadata.resource_version.as_deref().unwrap_or("");
        let revision = rv.parse::<u64>().map_err(|_| StoreError::Unavailable {
            backend: "kubernetes",
            location: self.location.clone(),
            detail: format!(
                "{key} has resourceVersion {rv:?}, which is not a decimal number: this store needs an \
                 etcd-backed API server"
            ),
            source: None,
        })?;
        Ok((
            name,
            Versioned {
                value,
                revision: Revision(revision),
            },
        ))
    }

    /// Applies `ops` in order, each compare-and-swap. On failure, says at which operation.
    async fn apply(&self, ops: &[Op]) -> Result<(), Failed> {
        for (at, op) in ops.iter().enumerate() {
            self.apply_one(op)
                .await
                .map_err(|error| Failed { at, error })?;
        }
        Ok(())
    }

    async fn apply_one(&self, op: &Op) -> Result<(), StoreError> {
        let key = op.key();
        let api = self.api(key.kind);
        let name = object_name(&key.name);
        match op {
            Op::Create { value, .. } => {
                let obj = self.object(key, value, None)?;
                api.create(&PostParams::default(), &obj)
                    .await
                    .map_err(|e| self.write_error(key, e))?;
            }
            Op::Update {
                value, revision, ..
            } => {
                let obj = self.object(key, value, Some(*revision))?;
                api.replace(&name, &PostParams::default(), &obj)
                    .await
                    .map_err(|e| self.write_error(key, e))?;
            }
            Op::Delete { revision, .. } => {
                let dp = DeleteParams {
                    preconditions: Some(Preconditions {
                        resource_version: Some(revision.0.to_string()),
                        uid: None,
                    }),
                    ..DeleteParams::default()
                };
                api.delete(&name, &dp)
                    .await
                    .map_err(|e| self.write_error(key, e))?;
            }
            Op::Check { revision, .. } => {
                let now = self.get(key).await?.map(|v| v.revision);
                if now != *revision {
                    return Err(StoreError::Conflict {
                        key: key.to_string(),
                    });
                }
            }
        }
        Ok(())
    }

    /// Finishes a read-modify-write whose first `done` operations were applied and whose next one lost a race:
    /// re-reads the keys not yet written, re-decides with the values the written keys were decided on, and writes
    /// the rest when the decision for the written keys is unchanged.
    async fn roll_forward<T, F>(
        &self,
        keys: &[Key],
        mut seen: Vec<Option<Versioned>>,
        mut decided: Vec<Write>,
        mut done: usize,
        f: &mut F,
    ) -> Result<T, StoreError>
    where
        F: FnMut(&[Option<Vec<u8>>]) -> (Vec<Write>, T) + Send,
    {
        let torn = |done: usize| StoreError::Torn {
            written: keys[..done]
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            unwritten: keys[done..]
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        };
        for _ in 0..RMW_RETRIES {
            for (slot, key) in seen.iter_mut().zip(keys).skip(done) {
                *slot = self.get(key).await?;
            }
            let values: Vec<Option<Vec<u8>>> = seen
                .iter()
                .map(|v| v.as_ref().map(|v| v.value.clone()))
                .collect();
            let (mut writes, out) = f(&values);
            writes.resize(keys.len(), Write::Keep);
            if writes[..done] != decided[..done] {
                return Err(torn(done));
            }
            let ops = plan_ops(&keys[done..], &seen[done..], writes[done..].to_vec());
            match self.apply(&ops).await {
                Ok(()) => return Ok(out),
                Err(Failed { at, error }) if error.is_conflict() => {
                    decided[done..done + at].clone_from_slice(&writes[done..done + at]);
                    done += at;
                }
                Err(Failed { error, .. }) => return Err(error),
            }
        }
        Err(torn(done))
    }
}

impl Store for KubeStore {
    fn backend(&self) -> &'static str {
        "kubernetes"
    }

    fn atomic_txn_limit(&self) -> Option<usize> {
        // A transaction's writes are made one by one.
        None
    }

    async fn get(&self, key: &Key) -> Result<Option<Versioned>, StoreError> {
        let obj = self
            .api(key.kind)
            .get_opt(&object_name(&key.name))
            .await
            .map_err(|e| self.unavailable(e))?;
        let Some(obj) = obj else { return Ok(None) };
        let (name, v) = self.versioned(key.kind, &obj)?;
        if name != key.name {
            return Err(StoreError::Unavailable {
                backend: "kubernetes",
                location: self.location.clone(),
                detail: format!(
                    "object {} holds {name:?}, not {:?} (a name-hash collision): rename one of them",
                    object_name(&key.name),
                    key.name
                ),
                source: None,
            });
        }
        Ok(Some(v))
    }

    async fn list(&self, kind: Kind, prefix: &str) -> Result<Vec<(String, Versioned)>, StoreError> {
        let mut lp = ListParams::default().limit(PAGE);
        if kind == Kind::Affinity
            && let Some(host) = prefix.strip_suffix('/')
            && !host.contains('/')
        {
            lp = lp.labels(&format!("{HOST_LABEL}={}", host_hash(host)));
        }
        let api = self.api(kind);
        let mut out = Vec::new();
        loop {
            let page = api.list(&lp).await.map_err(|e| self.unavailable(e))?;
            for obj in &page.items {
                if obj.metadata.deletion_timestamp.is_some() {
                    continue;
                }
                let (name, v) = self.versioned(kind, obj)?;
                if name.starts_with(prefix) {
                    out.push((name, v));
                }
            }
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => lp = lp.continue_token(&token),
                None => break,
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    async fn txn(&self, ops: Vec<Op>) -> Result<(), StoreError> {
        match self.apply(&ops).await {
            Ok(()) => Ok(()),
            Err(Failed { at, error }) => {
                let wrote = ops[..at].iter().any(|o| !matches!(o, Op::Check { .. }));
                if wrote && error.is_conflict() {
                    Err(StoreError::Torn {
                        written: ops[..at]
                            .iter()
                            .map(|o| o.key().to_string())
                            .collect::<Vec<_>>()
                            .join(", "),
                        unwritten: ops[at..]
                            .iter()
                            .map(|o| o.key().to_string())
                            .collect::<Vec<_>>()
                            .join(", "),
                    })
                } else {
                    Err(error)
                }
            }
        }
    }

    async fn read_modify_write<T, F>(&self, keys: Vec<Key>, mut f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnMut(&[Option<Vec<u8>>]) -> (Vec<Write>, T) + Send + 'static,
    {
        let mut last = None;
        for _ in 0..RMW_RETRIES {
            let mut seen = Vec::with_capacity(keys.len());
            for k in &keys {
                seen.push(self.get(k).await?);
            }
            let values: Vec<Option<Vec<u8>>> = seen
                .iter()
                .map(|v| v.as_ref().map(|v| v.value.clone()))
                .collect();
            let (mut writes, out) = f(&values);
            writes.resize(keys.len(), Write::Keep);
            let ops = plan_ops(&keys, &seen, writes.clone());
            if ops.iter().all(|o| matches!(o, Op::Check { .. })) {
                return Ok(out);
            }
            match self.apply(&ops).await {
                Ok(()) => return Ok(out),
                Err(Failed { at, error }) if error.is_conflict() => {
                    let wrote = ops[..at].iter().any(|o| !matches!(o, Op::Check { .. }));
                    if !wrote {
                        last = Some(error);
                        continue;
                    }
                    return self.roll_forward(&keys, seen, writes, at, &mut f).await;
                }
                Err(Failed { error, .. }) => return Err(error),
            }
        }
        Err(last.unwrap_or(StoreError::Conflict {
            key: "read-modify-write".into(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_names_are_valid_and_distinct() {
        for ok in ["default", "10.244.0.0-26", "pool-a", "net.abc123"] {
            assert_eq!(object_name(ok), ok);
        }
        let names = [
            "node-1/10.244.0.0-26",
            "node-1.10.244.0.0-26",
            "Net.ABC",
            "net.abc",
            "k8s-pod-network.Container_1",
            "fd00::-122",
            "///",
        ];
        let mapped: std::collections::BTreeSet<String> =
            names.iter().map(|n| object_name(n)).collect();
        assert_eq!(mapped.len(), names.len(), "{mapped:?}");
        for m in &mapped {
            assert!(is_object_name(m), "{m} is not a valid object name");
        }
        assert!(is_object_name(&object_name(&"a/".repeat(300))));
    }

    #[test]
    fn host_labels_are_valid_label_values() {
        let h = host_hash(&"very-long-host-name.".repeat(20));
        assert_eq!(h.len(), 16);
        assert!(h.bytes().all(|b| b.is_ascii_hexdigit()));
    }
}
