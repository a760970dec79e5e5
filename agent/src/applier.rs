//! The throttled apply loop: a thread that wakes on a change (or a retry timer), applies the
//! drivers under the node lock, and publishes the generation it applied. Before the first
//! in-sync it only attaches programs to new workload links. Failures keep the state dirty and
//! retry with backoff; after too many in a row the agent turns not-ready and asks to exit.

use std::{
    sync::{Arc, Condvar, Mutex, PoisonError},
    time::{Duration, Instant},
};

use serde::Serialize;
use tokio::sync::watch;

use crate::node::Node;

/// What the applier has achieved, published to waiters.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct Applied {
    /// The newest generation fully applied (0: none yet).
    pub generation: u64,
    /// True once an apply after the first in-sync succeeded and the last apply did not fail.
    pub ready: bool,
    /// The last apply error, if the last apply failed.
    pub error: Option<String>,
    /// Consecutive failed applies.
    pub failures: u32,
    /// Applies done.
    pub applies: u64,
}

/// Shared between the API, the link watcher and the applier thread.
pub struct Shared {
    /// The node's desired state.
    pub node: Mutex<Node>,
    wake: Condvar,
    pending: Mutex<bool>,
    applied: watch::Sender<Applied>,
}

/// Consecutive failures after which the agent gives up (the DaemonSet restarts it).
pub const MAX_FAILURES: u32 = 20;
const MIN_INTERVAL: Duration = Duration::from_millis(2);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

impl Shared {
    /// Wraps the node.
    pub fn new(node: Node) -> Arc<Self> {
        let (applied, _) = watch::channel(Applied::default());
        Arc::new(Self {
            node: Mutex::new(node),
            wake: Condvar::new(),
            pending: Mutex::new(false),
            applied,
        })
    }

    /// Locks the node (a poisoned lock is still usable: its state is always consistent between calls).
    pub fn lock(&self) -> std::sync::MutexGuard<'_, Node> {
        self.node.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Asks the applier to run.
    pub fn kick(&self) {
        *self.pending.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.wake.notify_one();
    }

    /// Subscribes to applier progress.
    pub fn subscribe(&self) -> watch::Receiver<Applied> {
        self.applied.subscribe()
    }

    /// The applier's latest state.
    pub fn applied(&self) -> Applied {
        self.applied.borrow().clone()
    }

    /// Waits until `generation` is applied (true), or `timeout` passes / the applier is failing (false).
    pub async fn wait_applied(&self, generation: u64, timeout: Duration) -> Result<(), String> {
        self.kick();
        let mut rx = self.subscribe();
        let wait = rx.wait_for(|a| a.generation >= generation || a.failures > 0);
        match tokio::time::timeout(timeout, wait).await {
            Ok(Ok(a)) if a.generation >= generation => Ok(()),
            Ok(Ok(a)) => Err(a
                .error
                .clone()
                .unwrap_or_else(|| "the dataplane apply failed".into())),
            Ok(Err(_)) => Err("the applier stopped".into()),
            Err(_) => Err(format!(
                "the dataplane did not apply the change within {} s",
                timeout.as_secs()
            )),
        }
    }

    /// Runs the apply loop on the current thread until `stop` returns true.
    pub fn run(&self, stop: &dyn Fn() -> bool) {
        let mut backoff = Duration::ZERO;
        let mut last = Instant::now() - MIN_INTERVAL;
        while !stop() {
            {
                let pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
                let wait = if backoff.is_zero() {
                    Duration::from_millis(500)
                } else {
                    backoff
                };
                let (mut pending, _) = self
                    .wake
                    .wait_timeout_while(pending, wait, |p| !*p)
                    .unwrap_or_else(PoisonError::into_inner);
                *pending = false;
            }
            let since = last.elapsed();
            if since < MIN_INTERVAL {
                std::thread::sleep(MIN_INTERVAL - since);
            }
            last = Instant::now();
            let mut node = self.lock();
            let generation = node.generation();
            let in_sync = node.in_sync();
            let already = self.applied.borrow().clone();
            if already.generation >= generation
                && already.error.is_none()
                && !node.dataplane.is_dirty()
            {
                continue;
            }
            let result = if in_sync {
                node.dataplane.apply()
            } else {
                node.dataplane.apply_before_in_sync()
            };
            drop(node);
            self.applied.send_modify(|a| {
                a.applies += 1;
                match &result {
                    Ok(()) if in_sync => {
                        a.generation = generation;
                        a.ready = true;
                        a.error = None;
                        a.failures = 0;
                    }
                    Ok(()) => {}
                    Err(e) => {
                        a.failures += 1;
                        a.error = Some(e.to_string());
                        a.ready = false;
                    }
                }
            });
            match result {
                Ok(()) => backoff = Duration::ZERO,
                Err(e) => {
                    tracing::warn!(error = %e, "dataplane apply failed; retrying");
                    backoff = (backoff * 2).clamp(Duration::from_millis(50), MAX_BACKOFF);
                }
            }
        }
    }
}
