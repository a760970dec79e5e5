//! Following kinds in etcd: one read-only txn lists them at one revision; one watch per kind's prefix, from
//! the revision after it, forwards every event. A watch canceled because its revision was compacted ends the
//! stream with [`StoreError::Compacted`]; any other failure ends it with [`StoreError::Unavailable`].

use std::collections::BTreeMap;

use etcd_client::{EventType, GetOptions, Txn, TxnOp, TxnOpResponse, WatchOptions, WatchResponse};
use tokio::sync::mpsc;

use super::{EtcdStore, irev, path, rev};
use crate::store::{
    Kind, Revision, StoreError, Versioned,
    watch::{Change, Changes, Listing, WatchStore},
};

/// How many watch responses may wait for the follower before the watch tasks wait for it.
const BACKLOG: usize = 256;

impl WatchStore for EtcdStore {
    async fn list_at(&self, kinds: Vec<Kind>) -> Result<Listing, StoreError> {
        let gets: Vec<TxnOp> = kinds
            .iter()
            .map(|k| TxnOp::get(path(*k, ""), Some(GetOptions::new().with_prefix())))
            .collect();
        let mut kv = self.client.kv_client();
        let resp = kv
            .txn(Txn::new().and_then(gets))
            .await
            .map_err(|e| self.unavailable(e))?;
        let at = resp
            .header()
            .map_or(0, etcd_client::ResponseHeader::revision);
        let mut rows = BTreeMap::new();
        for (kind, r) in kinds.iter().zip(resp.op_responses()) {
            let base = path(*kind, "");
            let mut list = Vec::new();
            if let TxnOpResponse::Get(g) = r {
                for kv in g.kvs() {
                    if let Some(name) = std::str::from_utf8(kv.key())
                        .ok()
                        .and_then(|k| k.strip_prefix(&base))
                    {
                        list.push((
                            name.to_owned(),
                            Versioned {
                                value: kv.value().to_vec(),
                                revision: rev(kv.mod_revision()),
                            },
                        ));
                    }
                }
            }
            list.sort_by(|a, b| a.0.cmp(&b.0));
            rows.insert(*kind, list);
        }
        Ok(Listing {
            rows,
            revision: Some(rev(at)),
        })
    }

    async fn watch(
        &self,
        kinds: Vec<Kind>,
        after: Revision,
    ) -> Result<Option<Changes>, StoreError> {
        let (tx, rx) = mpsc::channel(BACKLOG);
        let mut watcher = self.client.watch_client();
        for kind in kinds {
            let opts = WatchOptions::new()
                .with_prefix()
                .with_start_revision(irev(after).saturating_add(1));
            let mut stream = watcher
                .watch(path(kind, ""), Some(opts))
                .await
                .map_err(|e| self.unavailable(e))?;
            let (tx, store) = (tx.clone(), self.clone());
            tokio::spawn(async move {
                let base = path(kind, "");
                let end = loop {
                    let message = tokio::select! {
                        m = stream.message() => m,
                        // The follower stopped listening: the watch ends with it.
                        () = tx.closed() => return,
                    };
                    let resp = match message {
                        Ok(Some(resp)) => resp,
                        Ok(None) => {
                            break store.unavailable(etcd_client::Error::WatchError(
                                "the watch stream ended".into(),
                            ));
                        }
                        Err(e) => break store.unavailable(e),
                    };
                    if let Some(end) = canceled(&resp, after) {
                        break end;
                    }
                    let changes = changes(kind, &base, &resp);
                    if !changes.is_empty() && tx.send(Ok(changes)).await.is_err() {
                        return;
                    }
                };
                // The follower may be gone already; then nobody needs to hear why.
                let _ = tx.send(Err(end)).await;
            });
        }
        Ok(Some(rx))
    }
}

/// Why a canceled watch ended (`None`: not canceled).
fn canceled(resp: &WatchResponse, after: Revision) -> Option<StoreError> {
    if resp.compact_revision() > 0 {
        return Some(StoreError::Compacted {
            asked: after.0.saturating_add(1),
            compacted: rev(resp.compact_revision()).0,
        });
    }
    resp.canceled().then(|| StoreError::Unavailable {
        backend: "etcd",
        location: String::new(),
        detail: format!(
            "etcd canceled a watch ({}): check etcd's health",
            resp.cancel_reason()
        ),
        source: None,
    })
}

fn changes(kind: Kind, base: &str, resp: &WatchResponse) -> Vec<Change> {
    resp.events()
        .iter()
        .filter_map(|ev| {
            let kv = ev.kv()?;
            let name = std::str::from_utf8(kv.key()).ok()?.strip_prefix(base)?;
            Some(Change {
                kind,
                name: name.to_owned(),
                value: match ev.event_type() {
                    EventType::Put => Some(kv.value().to_vec()),
                    EventType::Delete => None,
                },
                revision: rev(kv.mod_revision()),
            })
        })
        .collect()
}
