//! One kube-rs watcher per kind, forwarding its events, converted, to the source's task.
//! The watcher lists (in pages of 500, with `limit`/`continue`), then watches from the list's
//! resourceVersion with bookmarks; a watch that ends is resumed from the last resourceVersion
//! seen (bookmarks included), a 410 Gone relists (`Init` … `InitDone`); every error is reported
//! and retried after `WatchBackoff`.

use std::fmt::Debug;

use futures_util::StreamExt as _;
use kube::{
    Api, Resource, ResourceExt as _,
    runtime::{WatchStreamExt as _, watcher},
};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;

use super::{backoff::WatchBackoff, cluster::Object, store::Key};

/// The kinds watched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// core/v1 Pods.
    Pods,
    /// core/v1 Namespaces.
    Namespaces,
    /// networking.k8s.io/v1 NetworkPolicies.
    NetworkPolicies,
    /// core/v1 Nodes.
    Nodes,
    /// core/v1 Services.
    Services,
    /// discovery.k8s.io/v1 EndpointSlices.
    EndpointSlices,
}

impl Kind {
    /// Every kind; in-sync needs the initial list of each.
    pub const ALL: [Self; 6] = [
        Self::Pods,
        Self::Namespaces,
        Self::NetworkPolicies,
        Self::Nodes,
        Self::Services,
        Self::EndpointSlices,
    ];

    /// The kind's name, as the API server writes it.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Pods => "Pod",
            Self::Namespaces => "Namespace",
            Self::NetworkPolicies => "NetworkPolicy",
            Self::Nodes => "Node",
            Self::Services => "Service",
            Self::EndpointSlices => "EndpointSlice",
        }
    }
}

/// What a watcher reports.
#[derive(Debug)]
pub enum Change {
    /// A (re)list starts.
    Init(Kind),
    /// An object of the list.
    InitApply(Kind, Key, Object),
    /// The list is complete.
    InitDone(Kind),
    /// An object was added or modified.
    Apply(Kind, Key, Object),
    /// An object was deleted.
    Delete(Kind, Key),
    /// The watcher failed (it retries after its backoff).
    Error(Kind, String),
}

impl Change {
    /// The kind it is about.
    #[must_use]
    pub fn kind(&self) -> Kind {
        match self {
            Self::Init(k)
            | Self::InitApply(k, ..)
            | Self::InitDone(k)
            | Self::Apply(k, ..)
            | Self::Delete(k, _)
            | Self::Error(k, _) => *k,
        }
    }
}

fn key<K: Resource>(object: &K) -> Key {
    (object.namespace().unwrap_or_default(), object.name_any())
}

/// Runs the watcher of `kind` until the receiver is gone.
pub async fn forward<K>(
    api: Api<K>,
    kind: Kind,
    convert: fn(&K) -> Object,
    tx: mpsc::UnboundedSender<Change>,
) where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let stream = watcher(api, watcher::Config::default()).backoff(WatchBackoff::default());
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        let change = match event {
            Ok(watcher::Event::Init) => Change::Init(kind),
            Ok(watcher::Event::InitApply(o)) => Change::InitApply(kind, key(&o), convert(&o)),
            Ok(watcher::Event::InitDone) => Change::InitDone(kind),
            Ok(watcher::Event::Apply(o)) => Change::Apply(kind, key(&o), convert(&o)),
            Ok(watcher::Event::Delete(o)) => Change::Delete(kind, key(&o)),
            // 410 Gone: the history is compacted past our resourceVersion; the watcher relists
            // (its `Init` follows). The protocol working, not the API server failing.
            Err(watcher::Error::WatchError(status)) if status.code == 410 => {
                tracing::info!(kind = kind.name(), reason = %status.message, "watch expired (410 Gone); relisting");
                continue;
            }
            Err(e) => Change::Error(kind, e.to_string()),
        };
        if tx.send(change).is_err() {
            return;
        }
    }
}
