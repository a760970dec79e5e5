//! The etcd v3 store: keys under `/weir/ipam/v1/<kind>/<name>`, compare-and-swap by `mod_revision` in a txn.

use std::{sync::Arc, time::Duration};

use etcd_client::{Client, Compare, CompareOp, ConnectOptions, GetOptions, Txn, TxnOp};

use super::{Key, Kind, Op, Revision, Store, StoreError, Versioned};

const ROOT: &str = "/weir/ipam/v1";

/// An etcd cluster.
#[derive(Clone)]
pub struct EtcdStore {
    client: Arc<Client>,
    endpoints: String,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.endpoints)
            .finish()
    }
}

fn path(kind: Kind, name: &str) -> String {
    format!("{ROOT}/{}/{name}", kind.as_str())
}

impl EtcdStore {
    /// Connects to `endpoints` and checks that the cluster answers.
    pub async fn connect(endpoints: &[String]) -> Result<Self, StoreError> {
        let joined = endpoints.join(",");
        let opts = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(3))
            .with_timeout(Duration::from_secs(10));
        let unavailable = |e: etcd_client::Error| StoreError::Unavailable {
            backend: "etcd",
            location: joined.clone(),
            detail:
                "cannot reach etcd: check that it runs and that --datastore names its client URLs"
                    .into(),
            source: Some(Box::new(e)),
        };
        let mut client = Client::connect(endpoints, Some(opts))
            .await
            .map_err(unavailable)?;
        client.status().await.map_err(unavailable)?;
        Ok(Self {
            client: Arc::new(client),
            endpoints: joined,
        })
    }

    fn unavailable(&self, e: etcd_client::Error) -> StoreError {
        StoreError::Unavailable {
            backend: "etcd",
            location: self.endpoints.clone(),
            detail: "request failed: check that etcd runs and has quorum".into(),
            source: Some(Box::new(e)),
        }
    }
}

fn rev(r: i64) -> Revision {
    Revision(u64::try_from(r).unwrap_or(0))
}

fn irev(r: Revision) -> i64 {
    i64::try_from(r.0).unwrap_or(i64::MAX)
}

impl Store for EtcdStore {
    fn backend(&self) -> &'static str {
        "etcd"
    }

    async fn get(&self, key: &Key) -> Result<Option<Versioned>, StoreError> {
        let mut kv = self.client.kv_client();
        let resp = kv
            .get(path(key.kind, &key.name), None)
            .await
            .map_err(|e| self.unavailable(e))?;
        Ok(resp.kvs().first().map(|kv| Versioned {
            value: kv.value().to_vec(),
            revision: rev(kv.mod_revision()),
        }))
    }

    async fn list(&self, kind: Kind, prefix: &str) -> Result<Vec<(String, Versioned)>, StoreError> {
        let mut kv = self.client.kv_client();
        let base = path(kind, "");
        let resp = kv
            .get(
                format!("{base}{prefix}"),
                Some(GetOptions::new().with_prefix()),
            )
            .await
            .map_err(|e| self.unavailable(e))?;
        let mut out: Vec<(String, Versioned)> = resp
            .kvs()
            .iter()
            .filter_map(|kv| {
                let name = std::str::from_utf8(kv.key())
                    .ok()?
                    .strip_prefix(&base)?
                    .to_owned();
                Some((
                    name,
                    Versioned {
                        value: kv.value().to_vec(),
                        revision: rev(kv.mod_revision()),
                    },
                ))
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    async fn txn(&self, ops: Vec<Op>) -> Result<(), StoreError> {
        let mut compares = Vec::with_capacity(ops.len());
        let mut actions = Vec::with_capacity(ops.len());
        for op in &ops {
            let p = path(op.key().kind, &op.key().name);
            match op {
                Op::Create { value, .. } => {
                    compares.push(Compare::version(p.clone(), CompareOp::Equal, 0));
                    actions.push(TxnOp::put(p, value.clone(), None));
                }
                Op::Update {
                    value, revision, ..
                } => {
                    compares.push(Compare::mod_revision(
                        p.clone(),
                        CompareOp::Equal,
                        irev(*revision),
                    ));
                    actions.push(TxnOp::put(p, value.clone(), None));
                }
                Op::Delete { revision, .. } => {
                    compares.push(Compare::mod_revision(
                        p.clone(),
                        CompareOp::Equal,
                        irev(*revision),
                    ));
                    actions.push(TxnOp::delete(p, None));
                }
                Op::Check {
                    revision: Some(r), ..
                } => {
                    compares.push(Compare::mod_revision(p, CompareOp::Equal, irev(*r)));
                }
                Op::Check { revision: None, .. } => {
                    compares.push(Compare::version(p, CompareOp::Equal, 0));
                }
            }
        }
        let mut kv = self.client.kv_client();
        let resp = kv
            .txn(Txn::new().when(compares).and_then(actions))
            .await
            .map_err(|e| self.unavailable(e))?;
        if resp.succeeded() {
            Ok(())
        } else {
            let key = ops.first().map(|o| o.key().to_string()).unwrap_or_default();
            Err(StoreError::Conflict { key })
        }
    }
}
