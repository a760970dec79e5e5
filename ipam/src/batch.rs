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
                let what = e.to_string();
                let mut first = Some(e);
                results.extend(outs.into_iter().map(|out| {
                    out.and_then(|_| {
                        let e = first.take().unwrap_or_else(|| shared_failure(&what));
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
fn shared_failure(what: &str) -> StoreError {
    StoreError::Unavailable {
        backend: "ipam",
        location: String::new(),
        detail: format!("the commit this operation shared failed: {what}"),
        source: None,
    }
}
