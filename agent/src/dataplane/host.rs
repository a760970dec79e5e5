//! The drivers of the host's own interfaces, held by the node and applied by the dataplane loop
//! beside the maps: the XDP prefilter (`prefilter`, applied from the first pass: it guards the
//! host and needs nothing from the sources) and the masquerade (`masquerade`, once the node is in
//! sync). Each isolates a failing interface (the others are programmed; it retries with its
//! backoff). Their failures do not fail the loop's apply (readiness is the pods' dataplane): they
//! are logged, published in the snapshot ([`HostStatus`]) and retried when the earliest interface
//! in backoff is due.

use std::time::{Duration, Instant};

use attach::AttachMode;
use ipnetwork::Ipv4Network;

use super::{
    masquerade::{AttachedMode, MasqDriver},
    plane::ApplyError,
    prefilter::{DenyFileRead, Prefilter},
};

/// A failed apply with no interface in backoff (a read back that failed) is retried after this.
const RETRY: Duration = Duration::from_secs(1);

/// What the host drivers' applies achieved, as the loop publishes it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostStatus {
    /// How each prefilter interface was attached (`--prefilter-interfaces`).
    pub prefilter: Vec<(String, AttachMode)>,
    /// Why the last prefilter apply left work (`None`: everything is programmed).
    pub prefilter_error: Option<String>,
    /// How each masquerade (interface, program) was attached.
    pub masquerade: Vec<AttachedMode>,
    /// Why the last masquerade apply left work.
    pub masquerade_error: Option<String>,
    /// Applies of the host drivers so far.
    pub applies: u64,
}

/// The prefilter and the masquerade (each `None` when the agent runs without it).
#[derive(Default)]
pub struct HostDrivers {
    /// The XDP prefilter.
    pub prefilter: Option<Prefilter>,
    /// The masquerade.
    pub masquerade: Option<MasqDriver>,
    retry_at: Option<Instant>,
    status: HostStatus,
}

impl HostDrivers {
    /// A new read of the prefilter's deny file. No kernel I/O.
    pub fn set_deny_file(&mut self, read: DenyFileRead) {
        if let Some(prefilter) = &mut self.prefilter {
            prefilter.set_file(read);
            // A new set is written at the next apply; an interface in backoff still waits.
            self.retry_at = None;
        }
    }

    /// The pools' IPv4 CIDRs for the masquerade. No kernel I/O.
    pub fn set_pools(&mut self, pools: Vec<Ipv4Network>) {
        if let Some(masquerade) = &mut self.masquerade {
            masquerade.set_pools(pools);
            self.retry_at = None;
        }
    }

    /// True when an apply has work to do and no retry is pending at `now` (the masquerade only
    /// once `in_sync`).
    #[must_use]
    pub fn is_due(&self, in_sync: bool, now: Instant) -> bool {
        let dirty = self.prefilter.as_ref().is_some_and(Prefilter::is_dirty)
            || (in_sync && self.masquerade.as_ref().is_some_and(MasqDriver::is_dirty));
        dirty && self.retry_at.is_none_or(|at| now >= at)
    }

    /// When work left by a failed apply is tried again.
    #[must_use]
    pub fn retry_at(&self) -> Option<Instant> {
        self.retry_at
    }

    /// A periodic refresh: the next apply reads the maps and link pins back in full.
    pub fn refresh(&mut self) {
        if let Some(prefilter) = &mut self.prefilter {
            prefilter.refresh();
        }
        if let Some(masquerade) = &mut self.masquerade {
            masquerade.request_resync();
        }
    }

    /// Reconciles the prefilter, and the masquerade once `in_sync`; a failure is logged when its
    /// text changes and retried when due (the loop calls this on its thread).
    pub fn apply(&mut self, in_sync: bool) {
        let now = Instant::now();
        let mut retry: Vec<Option<Instant>> = Vec::new();
        if let Some(prefilter) = &mut self.prefilter {
            let result = prefilter.apply();
            self.status.prefilter = prefilter.modes();
            retry.push(note(
                "prefilter",
                result,
                &mut self.status.prefilter_error,
                now,
            ));
        }
        if in_sync && let Some(masquerade) = &mut self.masquerade {
            let result = masquerade.apply();
            self.status.masquerade = masquerade.modes();
            retry.push(note(
                "masquerade",
                result,
                &mut self.status.masquerade_error,
                now,
            ));
        }
        self.status.applies += 1;
        self.retry_at = retry.into_iter().flatten().min();
    }

    /// What the applies achieved.
    #[must_use]
    pub fn status(&self) -> &HostStatus {
        &self.status
    }
}

/// Keeps `result` in `error` (logged when it changes); when to retry.
fn note(
    driver: &str,
    result: Result<(), ApplyError>,
    error: &mut Option<String>,
    now: Instant,
) -> Option<Instant> {
    match result {
        Ok(()) => {
            if error.take().is_some() {
                tracing::info!(driver, "host interfaces programmed");
            }
            None
        }
        Err(e) => {
            let text = e.to_string();
            if error.as_deref() != Some(text.as_str()) {
                tracing::warn!(driver, error = %text, "host interfaces not fully programmed; retrying");
            }
            *error = Some(text);
            Some(e.retry_at().unwrap_or(now + RETRY))
        }
    }
}
