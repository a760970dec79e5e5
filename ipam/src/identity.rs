//! Cluster-wide security identities allocated through the datastore by compare-and-swap (as Cilium's
//! CiliumIdentity / kvstore allocator): the same label set gets the same number on every node, stable across
//! restarts, released only after a grace period once no node uses it.
//!
//! - **Allocate** reads the label set's [`IdentityKey`] (named by a hash of the canonical labels; a hash shared
//!   with another label set probes the next name). Found: the node adds itself to the [`Identity`]'s users
//!   (read-modify-write). Not found: it claims the lowest number no [`Identity`] holds with one transaction that
//!   creates both objects (`Create` fails when either exists, so two nodes racing for one label set or one
//!   number cannot both win; the loser retries with fresh reads and finds the winner's).
//! - **Use** is a renewal time per node. A node renews what it uses ([`IdentityAllocator::renew`]) more often
//!   than the grace period, and releases what it stopped using ([`IdentityAllocator::release`]); a node that
//!   died simply stops renewing.
//! - **Garbage collection** ([`IdentityAllocator::collect_garbage`], any node may run it) deletes an identity
//!   with no user renewed within the grace period and no use at all for the grace period, by one transaction
//!   conditional on the revisions it read: a node that renewed meanwhile makes it fail. A number is reused only
//!   after that, so it never names two label sets while anyone uses it.
//!
//! On a store without multi-object transactions (Kubernetes) the two creates run in order, [`Identity`]
//! first: a lost race for the key after the number was claimed deletes the claimed number again; a crash in
//! between leaves a claimed number with no key and a user that never renews, which the garbage collection
//! releases. Deletes run in the same order (the number, then its key), so a key may name a missing number
//! but a used number never loses its key.

use std::{collections::BTreeMap, ops::RangeInclusive};

use crate::{
    allocator::{decode, encode},
    cidr::fnv1a,
    model::{Identity, IdentityKey},
    store::{Key, Kind, Op, RMW_RETRIES, Store, StoreError, Write},
};

/// Labels.
pub type Labels = BTreeMap<String, String>;

/// An identity operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// The datastore failed.
    #[error("cannot {what} in the datastore: {source}")]
    Store {
        /// What was being done.
        what: &'static str,
        /// The cause.
        #[source]
        source: StoreError,
    },
    /// Every number of the range is taken.
    #[error(
        "every security identity number from {first} to {last} is in use: remove unused label sets (the garbage \
         collection releases them after the grace period)"
    )]
    Exhausted {
        /// First number of the range.
        first: u32,
        /// Last number of the range.
        last: u32,
    },
    /// Other nodes kept winning the races.
    #[error(
        "gave up allocating an identity for {labels} after {RMW_RETRIES} compare-and-swap conflicts: the datastore is \
         too contended; retry"
    )]
    Contended {
        /// The label set.
        labels: String,
    },
}

fn store_err(what: &'static str) -> impl FnOnce(StoreError) -> IdentityError {
    move |source| IdentityError::Store { what, source }
}

/// The canonical text of a label set (sorted `key=value`, comma-separated).
#[must_use]
pub fn canonical(labels: &Labels) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn key_name(labels: &Labels, probe: u32) -> String {
    let hash = fnv1a(&canonical(labels));
    if probe == 0 {
        format!("{hash:016x}")
    } else {
        format!("{hash:016x}-{probe}")
    }
}

fn identity_key(id: u32) -> Key {
    Key::new(Kind::Identity, format!("{id:010}"))
}

/// Allocates, renews, releases and collects identities for one node.
#[derive(Clone, Debug)]
pub struct IdentityAllocator<S> {
    store: S,
    node: String,
    range: RangeInclusive<u32>,
    grace_secs: u64,
}

/// Where a label set's key is, and what it says.
enum Found {
    /// The key exists for these labels.
    Key { name: String, id: u32 },
    /// No key: this name is free for the labels.
    Free { name: String },
}

impl<S: Store> IdentityAllocator<S> {
    /// An allocator for `node` handing out numbers of `range`, releasing identities unused for `grace_secs`.
    pub fn new(
        store: S,
        node: impl Into<String>,
        range: RangeInclusive<u32>,
        grace_secs: u64,
    ) -> Self {
        Self {
            store,
            node: node.into(),
            range,
            grace_secs,
        }
    }

    async fn find(&self, labels: &Labels) -> Result<Found, IdentityError> {
        for probe in 0..64 {
            let name = key_name(labels, probe);
            let key = Key::new(Kind::IdentityKey, name.clone());
            match self
                .store
                .get(&key)
                .await
                .map_err(store_err("read an identity key"))?
            {
                None => return Ok(Found::Free { name }),
                Some(v) => {
                    let k: IdentityKey =
                        decode(&key, &v.value).map_err(store_err("decode an identity key"))?;
                    if &k.labels == labels {
                        return Ok(Found::Key { name, id: k.id });
                    }
                }
            }
        }
        Err(IdentityError::Contended {
            labels: canonical(labels),
        })
    }

    /// The identity of `labels`, allocating it if no node has; this node is recorded as a user at `now`
    /// (seconds since the Unix epoch).
    pub async fn allocate(&self, labels: &Labels, now: u64) -> Result<u32, IdentityError> {
        for _ in 0..RMW_RETRIES {
            match self.find(labels).await? {
                Found::Key { name, id } => {
                    if self.add_user(id, labels, &name, now).await? {
                        return Ok(id);
                    }
                    // The key points at a number whose identity is gone or holds other labels (a torn or
                    // collected pair): remove the stale key and allocate afresh.
                    self.remove_stale_key(&name, id).await?;
                }
                Found::Free { name } => {
                    if let Some(id) = self.claim(labels, &name, now).await? {
                        return Ok(id);
                    }
                }
            }
        }
        Err(IdentityError::Contended {
            labels: canonical(labels),
        })
    }

    /// Adds this node to `id`'s users; false when `id` is not (or no longer) the identity of `labels`.
    async fn add_user(
        &self,
        id: u32,
        labels: &Labels,
        key: &str,
        now: u64,
    ) -> Result<bool, IdentityError> {
        let node = self.node.clone();
        let (labels, key_name) = (labels.clone(), key.to_owned());
        let ikey = identity_key(id);
        let decode_key = ikey.clone();
        self.store
            .read_modify_write(vec![ikey], move |read| {
                let Some(Some(bytes)) = read.first() else {
                    return (vec![Write::Keep], false);
                };
                let Ok(mut identity) = decode::<Identity>(&decode_key, bytes) else {
                    return (vec![Write::Keep], false);
                };
                if identity.labels != labels || identity.key != key_name {
                    return (vec![Write::Keep], false);
                }
                identity.users.insert(node.clone(), now);
                identity.unused_since = None;
                (vec![Write::Put(encode(&identity))], true)
            })
            .await
            .map_err(store_err("record this node as a user of an identity"))
    }

    async fn remove_stale_key(&self, name: &str, id: u32) -> Result<(), IdentityError> {
        let key = Key::new(Kind::IdentityKey, name.to_owned());
        let ikey = identity_key(id);
        let Some(v) = self
            .store
            .get(&key)
            .await
            .map_err(store_err("read an identity key"))?
        else {
            return Ok(());
        };
        // Only while the identity it names is still missing or someone else's.
        let current = self
            .store
            .get(&ikey)
            .await
            .map_err(store_err("read an identity"))?;
        let mut ops = vec![Op::Delete {
            key,
            revision: v.revision,
        }];
        match current {
            None => ops.push(Op::Check {
                key: ikey,
                revision: None,
            }),
            Some(c) => {
                let identity: Identity =
                    decode(&ikey, &c.value).map_err(store_err("decode an identity"))?;
                if identity.key == name {
                    return Ok(());
                }
                ops.push(Op::Check {
                    key: ikey,
                    revision: Some(c.revision),
                });
            }
        }
        match self.store.txn(ops).await {
            Ok(()) => Ok(()),
            Err(e) if e.is_conflict() => Ok(()),
            Err(source) => Err(IdentityError::Store {
                what: "remove a stale identity key",
                source,
            }),
        }
    }

    /// Claims the lowest free number for `labels` under key `name`; `None` when a race was lost (retry).
    async fn claim(
        &self,
        labels: &Labels,
        name: &str,
        now: u64,
    ) -> Result<Option<u32>, IdentityError> {
        let taken = self
            .store
            .list(Kind::Identity, "")
            .await
            .map_err(store_err("list identities"))?;
        let taken: std::collections::BTreeSet<u32> =
            taken.iter().filter_map(|(n, _)| n.parse().ok()).collect();
        let Some(id) = self.range.clone().find(|id| !taken.contains(id)) else {
            return Err(IdentityError::Exhausted {
                first: *self.range.start(),
                last: *self.range.end(),
            });
        };
        let identity = Identity {
            id,
            labels: labels.clone(),
            key: name.to_owned(),
            users: BTreeMap::from([(self.node.clone(), now)]),
            unused_since: None,
        };
        let index = IdentityKey {
            labels: labels.clone(),
            id,
        };
        let ops = vec![
            Op::Create {
                key: identity_key(id),
                value: encode(&identity),
            },
            Op::Create {
                key: Key::new(Kind::IdentityKey, name.to_owned()),
                value: encode(&index),
            },
        ];
        match self.store.txn(ops).await {
            Ok(()) => Ok(Some(id)),
            Err(e) if e.is_conflict() => {
                // Non-atomic stores may have created the identity before losing the key: give the number back.
                self.unclaim(id, name).await?;
                Ok(None)
            }
            Err(StoreError::Torn { .. }) => {
                self.unclaim(id, name).await?;
                Ok(None)
            }
            Err(source) => Err(IdentityError::Store {
                what: "create an identity",
                source,
            }),
        }
    }

    /// Deletes identity `id` if it is ours for key `name` and its key does not point at it.
    async fn unclaim(&self, id: u32, name: &str) -> Result<(), IdentityError> {
        let ikey = identity_key(id);
        let Some(v) = self
            .store
            .get(&ikey)
            .await
            .map_err(store_err("read an identity"))?
        else {
            return Ok(());
        };
        let identity: Identity =
            decode(&ikey, &v.value).map_err(store_err("decode an identity"))?;
        if identity.key != name || identity.users.keys().any(|n| n != &self.node) {
            return Ok(());
        }
        let index = Key::new(Kind::IdentityKey, name.to_owned());
        if let Some(k) = self
            .store
            .get(&index)
            .await
            .map_err(store_err("read an identity key"))?
        {
            let k: IdentityKey =
                decode(&index, &k.value).map_err(store_err("decode an identity key"))?;
            if k.id == id {
                return Ok(());
            }
        }
        match self
            .store
            .txn(vec![Op::Delete {
                key: ikey,
                revision: v.revision,
            }])
            .await
        {
            Ok(()) => Ok(()),
            Err(e) if e.is_conflict() => Ok(()),
            Err(source) => Err(IdentityError::Store {
                what: "give back a claimed identity number",
                source,
            }),
        }
    }

    /// Renews this node's use of every identity of `ids` at `now`. An identity that is gone is skipped (the
    /// caller allocates its labels again).
    pub async fn renew(&self, ids: &[u32], now: u64) -> Result<Vec<u32>, IdentityError> {
        let mut gone = Vec::new();
        for id in ids {
            let node = self.node.clone();
            let ikey = identity_key(*id);
            let decode_key = ikey.clone();
            let present = self
                .store
                .read_modify_write(vec![ikey], move |read| {
                    let Some(Some(bytes)) = read.first() else {
                        return (vec![Write::Keep], false);
                    };
                    let Ok(mut identity) = decode::<Identity>(&decode_key, bytes) else {
                        return (vec![Write::Keep], false);
                    };
                    identity.users.insert(node.clone(), now);
                    identity.unused_since = None;
                    (vec![Write::Put(encode(&identity))], true)
                })
                .await
                .map_err(store_err("renew an identity"))?;
            if !present {
                gone.push(*id);
            }
        }
        Ok(gone)
    }

    /// This node stops using `id` at `now`.
    pub async fn release(&self, id: u32, now: u64) -> Result<(), IdentityError> {
        let node = self.node.clone();
        let ikey = identity_key(id);
        let decode_key = ikey.clone();
        self.store
            .read_modify_write(vec![ikey], move |read| {
                let Some(Some(bytes)) = read.first() else {
                    return (vec![Write::Keep], ());
                };
                let Ok(mut identity) = decode::<Identity>(&decode_key, bytes) else {
                    return (vec![Write::Keep], ());
                };
                if identity.users.remove(&node).is_none() {
                    return (vec![Write::Keep], ());
                }
                if identity.users.is_empty() {
                    identity.unused_since = Some(now);
                }
                (vec![Write::Put(encode(&identity))], ())
            })
            .await
            .map_err(store_err("release an identity"))
    }

    /// Every identity, by number.
    pub async fn list(&self) -> Result<Vec<Identity>, IdentityError> {
        let listed = self
            .store
            .list(Kind::Identity, "")
            .await
            .map_err(store_err("list identities"))?;
        listed
            .into_iter()
            .map(|(name, v)| {
                decode::<Identity>(&Key::new(Kind::Identity, name), &v.value)
                    .map_err(store_err("decode an identity"))
            })
            .collect()
    }

    /// Whether `identity` may be collected at `now`: no user renewed within the grace period, and its last
    /// use (a renewal or the release) at least a grace period ago.
    #[must_use]
    pub fn collectable(&self, identity: &Identity, now: u64) -> bool {
        let last_use = identity
            .users
            .values()
            .copied()
            .chain(identity.unused_since)
            .max()
            .unwrap_or(0);
        now.saturating_sub(last_use) >= self.grace_secs
    }

    /// Deletes every identity [`Self::collectable`] at `now`; answers the numbers released.
    pub async fn collect_garbage(&self, now: u64) -> Result<Vec<u32>, IdentityError> {
        let listed = self
            .store
            .list(Kind::Identity, "")
            .await
            .map_err(store_err("list identities"))?;
        let mut released = Vec::new();
        for (name, v) in listed {
            let ikey = Key::new(Kind::Identity, name);
            let identity: Identity =
                decode(&ikey, &v.value).map_err(store_err("decode an identity"))?;
            if !self.collectable(&identity, now) {
                continue;
            }
            let index = Key::new(Kind::IdentityKey, identity.key.clone());
            let mut ops = vec![Op::Delete {
                key: ikey,
                revision: v.revision,
            }];
            if let Some(k) = self
                .store
                .get(&index)
                .await
                .map_err(store_err("read an identity key"))?
            {
                let entry: IdentityKey =
                    decode(&index, &k.value).map_err(store_err("decode an identity key"))?;
                if entry.id == identity.id {
                    // The number goes first on stores without transactions: a renewal that wins the race
                    // keeps both; a crash after it leaves a key naming a missing number, which the next
                    // allocation of those labels removes before it claims a new one.
                    ops.push(Op::Delete {
                        key: index,
                        revision: k.revision,
                    });
                }
            }
            match self.store.txn(ops).await {
                Ok(()) => released.push(identity.id),
                Err(e) if e.is_conflict() => {}
                Err(source) => {
                    return Err(IdentityError::Store {
                        what: "delete an unused identity",
                        source,
                    });
                }
            }
        }
        Ok(released)
    }
}
