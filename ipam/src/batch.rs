//! Several IPAM operations in one durable commit.
//!
//! [`run`] takes jobs that would otherwise run one after another, each paying its own commit (an agent
//! serialises a host's allocations), and runs them one after another on an [`Overlay`] of the store: each job sees
//! every write of the jobs before it, exactly as if they had committed, and then one transaction writes all of
//! them. A job that fails is rolled back inside the overlay (nothing of it is ever written); the others commit.
//! If the commit loses a compare-and-swap (someone else wrote a key the jobs decided on), nothing was written and
//! the jobs run again on fresh reads; after [`COMMIT_RETRIES`] lost commits the rest run one per commit. A
//! commit holds at most the store's [`atomic_txn_limit`](Store::atomic_txn_limit) operations: the job that
//! would exceed it starts the next commit. The results come back only after their commit is durable.

use std::future::Future;

use crate::{
    Ipam, IpamError,
    store::{Store, StoreError, overlay::Overlay},
};

/// How many lost commits of one group of jobs are retried together before they run one per commit.
pub const COMMIT_RETRIES: usize = 8;

/// What a [`run`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Transactions committed (or attempted for the last time).
    pub commits: usize,
    /// Commits that lost a compare-and-swap and were run again.
    pub retries: usize,
}

/// Runs `jobs` in order on overlays of `ipam`'s store, committing as many of them together as the store allows.
/// Returns each job's result, in order.
///
/// Only for stores whose transactions are atomic ([`Store::atomic_txn_limit`] is `Some`); on others the
/// caller runs its jobs on the store itself.
pub async fn run<S, J, T, E, F, Fut>(ipam: &Ipam<S>, jobs: &[J], f: F) -> (Vec<Result<T, E>>, Stats)
where
    S: Store + Clone,
    J: Clone,
    E: From<IpamError>,
    F: Fn(Ipam<Overlay<S>>, J) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let limit = ipam.store().atomic_txn_limit().unwrap_or(1).max(1);
    let mut results = Vec::with_capacity(jobs.len());
    let mut stats = Stats::default();
    let (mut lost, mut one_each) = (0, false);
    while results.len() < jobs.len() {
        let rest = &jobs[results.len()..];
        let overlay = Overlay::new(ipam.store().clone());
        let on = Ipam::with_clock(overlay.clone(), ipam.clock().clone());
        let mut outs = Vec::new();
        for job in rest {
            if one_each && !outs.is_empty() {
                break;
            }
            let mark = overlay.mark();
            let out = f(on.clone(), job.clone()).await;
            if out.is_err() {
                overlay.rollback(mark);
            } else if overlay.op_count() > limit && !outs.is_empty() {
                // Too many operations for one transaction: this job starts the next commit.
                overlay.rollback(mark);
                break;
            }
            outs.push(out);
        }
        stats.commits += 1;
        match overlay.commit().await {
            Ok(()) => {
                results.extend(outs);
                lost = 0;
            }
            Err(e) if e.is_conflict() && lost < COMMIT_RETRIES => {
                lost += 1;
                stats.retries += 1;
            }
            Err(e) if e.is_conflict() && !one_each => {
                // Contended: run the rest one per commit, each with its own retries.
                tracing::debug!(error = %e, jobs = outs.len(), "shared commits keep losing; committing jobs one by one");
                one_each = true;
                lost = 0;
            }
            Err(e) => {
                let (what, backend, location) = match &e {
                    StoreError::Unavailable {
                        backend,
                        location,
                        detail,
                        ..
                    } => (detail.clone(), *backend, location.clone()),
                    other => (other.to_string(), "ipam", "the shared commit".to_owned()),
                };
                let mut first = Some(e);
                results.extend(outs.into_iter().map(|out| {
                    out.and_then(|_| {
                        let e = first
                            .take()
                            .unwrap_or_else(|| shared_failure(backend, &location, &what));
                        Err(E::from(IpamError::Store(e)))
                    })
                }));
                lost = 0;
            }
        }
    }
    (results, stats)
}

/// The error of a job whose shared commit failed with `what` (the first job of the commit gets the original).
fn shared_failure(backend: &'static str, location: &str, what: &str) -> StoreError {
    StoreError::Unavailable {
        backend,
        location: location.to_owned(),
        detail: format!("the commit this operation shared failed: {what}"),
        source: None,
    }
}

#[cfg(test)]
mod tests {
    use std::{
        collections::BTreeSet,
        net::IpAddr,
        sync::{
            Arc,
            atomic::{AtomicUsize, Ordering},
        },
    };

    use super::*;
    use crate::{
        AssignArgs,
        model::{IpPool, IpUse},
        store::{
            Key, Kind, Op, Versioned,
            memory::{Faults, MemoryStore},
        },
    };

    /// A memory store whose transactions may hold at most `limit` operations (as etcd's `--max-txn-ops`).
    #[derive(Clone)]
    struct Limited {
        inner: MemoryStore,
        limit: usize,
        largest: Arc<AtomicUsize>,
    }

    impl Store for Limited {
        fn backend(&self) -> &'static str {
            "limited"
        }

        fn atomic_txn_limit(&self) -> Option<usize> {
            Some(self.limit)
        }

        async fn get(&self, key: &Key) -> Result<Option<Versioned>, StoreError> {
            self.inner.get(key).await
        }

        async fn list(
            &self,
            kind: Kind,
            prefix: &str,
        ) -> Result<Vec<(String, Versioned)>, StoreError> {
            self.inner.list(kind, prefix).await
        }

        async fn txn(&self, ops: Vec<Op>) -> Result<(), StoreError> {
            assert!(
                ops.len() <= self.limit,
                "{} operations in one txn",
                ops.len()
            );
            self.largest.fetch_max(ops.len(), Ordering::SeqCst);
            self.inner.txn(ops).await
        }
    }

    async fn with_pool<S: Store + Clone>(store: S) -> Ipam<S> {
        let ipam = Ipam::new(store);
        ipam.add_pool(IpPool {
            name: "p".into(),
            cidr: "10.40.0.0/24".parse().expect("cidr"),
            block_size: 28,
            node_selector: String::new(),
            namespace_selector: String::new(),
            allowed_uses: vec![IpUse::Workload],
            disabled: false,
        })
        .await
        .expect("pool");
        ipam
    }

    async fn allocate<S: Store + Clone>(
        ipam: Ipam<S>,
        handle: String,
    ) -> Result<Vec<IpAddr>, IpamError> {
        if handle.starts_with("bad") {
            // Allocate first, then fail: none of it may be written.
            ipam.auto_assign(&AssignArgs::new("n1", &handle, 1, 0))
                .await?;
            return Err(IpamError::InvalidArgument {
                what: handle,
                fix: "none".into(),
            });
        }
        let r = ipam
            .auto_assign(&AssignArgs::new("n1", &handle, 1, 0))
            .await?;
        Ok(r.ips())
    }

    async fn held<S: Store + Clone>(ipam: &Ipam<S>, handle: &str) -> Vec<IpAddr> {
        match ipam.ips_by_handle(handle).await {
            Ok(nets) => nets.iter().map(ipnetwork::IpNetwork::ip).collect(),
            Err(IpamError::HandleNotFound { .. }) => Vec::new(),
            Err(e) => panic!("{e}"),
        }
    }

    #[tokio::test]
    async fn jobs_see_each_other_and_share_one_commit_and_a_failed_job_leaves_nothing() {
        let store = MemoryStore::new();
        let ipam = with_pool(store.clone()).await;
        let jobs: Vec<String> = (0..20)
            .map(|i| {
                if i == 7 {
                    "bad-7".into()
                } else {
                    format!("h{i}")
                }
            })
            .collect();
        let writes = store.writes();
        let (results, stats) = run(&ipam, &jobs, allocate).await;
        assert_eq!(store.writes(), writes + 1, "one transaction for the batch");
        assert_eq!(
            stats,
            Stats {
                commits: 1,
                retries: 0
            }
        );
        let mut seen = BTreeSet::new();
        for (job, r) in jobs.iter().zip(&results) {
            if job.starts_with("bad") {
                assert!(r.is_err());
                assert!(
                    held(&ipam, job).await.is_empty(),
                    "a failed job wrote nothing"
                );
                continue;
            }
            let ips = r.as_ref().expect("allocated");
            assert_eq!(held(&ipam, job).await, *ips, "{job} is durable as returned");
            assert!(seen.insert(ips[0]), "{} handed out twice", ips[0]);
        }
        // 19 addresses from /28 blocks: the jobs claimed blocks for each other, not one each.
        assert_eq!(
            ipam.host_affinities("n1").await.expect("affinities").len(),
            2
        );
        assert!(ipam.check().await.expect("check").ok());
    }

    #[tokio::test]
    async fn lost_commits_run_again_and_nothing_is_handed_out_twice() {
        let store = MemoryStore::new();
        let ipam = with_pool(store.clone()).await;
        store.set_faults(
            Faults {
                conflict_per_mille: 600,
                ..Faults::default()
            },
            7,
        );
        let (mut retries, mut seen) = (0, BTreeSet::new());
        for round in 0..10 {
            let jobs: Vec<String> = (0..6).map(|i| format!("h{round}-{i}")).collect();
            let (results, stats) = run(&ipam, &jobs, allocate).await;
            retries += stats.retries;
            for (job, r) in jobs.iter().zip(results) {
                // A job may give up after too many lost commits; one that returned holds what it returned.
                let Ok(ips) = r else { continue };
                assert_eq!(held(&ipam, job).await, ips);
                assert!(seen.insert(ips[0]));
            }
        }
        store.set_faults(Faults::default(), 1);
        assert!(retries > 0, "the injected conflicts were retried");
        assert!(
            !seen.is_empty(),
            "some jobs committed despite the conflicts"
        );
        assert!(ipam.check().await.expect("check").ok());
    }

    #[tokio::test]
    async fn a_commit_never_exceeds_the_stores_transaction_limit() {
        let store = Limited {
            inner: MemoryStore::new(),
            limit: 12,
            largest: Arc::default(),
        };
        let ipam = with_pool(store.clone()).await;
        let jobs: Vec<String> = (0..40).map(|i| format!("h{i}")).collect();
        let (results, stats) = run(&ipam, &jobs, allocate).await;
        assert!(
            stats.commits > 3,
            "{stats:?}: 40 handles do not fit in 12 operations"
        );
        assert!(store.largest.load(Ordering::SeqCst) <= 12);
        let all: BTreeSet<IpAddr> = results
            .into_iter()
            .map(|r| r.expect("allocated")[0])
            .collect();
        assert_eq!(all.len(), 40);
        assert!(ipam.check().await.expect("check").ok());
    }
}
