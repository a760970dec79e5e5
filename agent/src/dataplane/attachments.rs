//! The attachment driver: both tc programs on every `weir*` link, by the configured mechanism
//! (`attach::Mechanism`: clsact + `cls_bpf` filters, or pinned tcx links).
//!
//! Read back, per link and hook: the program the mechanism's own attachment runs (weir's filter
//! slot, or a link pin live on this interface), and leftovers (the other mechanism's attachment,
//! a pin that outlived its interface, a stray filter named after the program). Classify: in sync
//! (right program), out of sync (other program → atomic replacement: `RTM_NEWTFILTER` on the same
//! slot, or `bpf_link_update`), missing (attach anew); leftovers are removed only once the
//! link's own attachment is in place, so a link never goes without a program. Link pins of links
//! that are no longer desired are orphans (unpinned, which detaches them).

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Instant,
};

use maps_schema::programs::{FROM_ENDPOINT, TO_ENDPOINT};
use serde::Serialize;

use super::{map_driver::Pending, retry::Backoff};
pub use crate::kernel::{Attacher, Hook};
use crate::kernel::{KernelError, TcAttachType};

/// Counters of the attachment driver.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AttachStats {
    /// New attachments.
    pub attaches: u64,
    /// Program replacements through existing links.
    pub updates: u64,
    /// Pins removed and leftovers swept (orphans, stale pins, the other mechanism's attachments).
    pub unpins: u64,
    /// Applies that failed.
    pub errors: u64,
    /// Tampering repaired: a program found missing (filter, qdisc or link removed from outside)
    /// or replaced on a link the driver had in place (in the status and metrics as
    /// `DataplaneStats::repairs`).
    #[serde(skip)]
    pub repairs: u64,
}

const HOOKS: [(&str, TcAttachType); 2] = [
    (FROM_ENDPOINT, TcAttachType::Ingress),
    (TO_ENDPOINT, TcAttachType::Egress),
];

/// Desired attachments: every workload link (ifname → ifindex).
pub struct AttachDriver {
    io: Box<dyn Attacher>,
    links: BTreeMap<String, u32>,
    /// Links that are not up yet: nothing is attached to them until they come up (the CNI
    /// attaches before it brings a link up; attaching here too would only race it).
    down: BTreeSet<String>,
    dirty: BTreeSet<String>,
    /// Links whose last reconcile left both programs attached: anything else found there later
    /// was done from outside.
    in_place: BTreeSet<String>,
    resync: bool,
    stats: AttachStats,
    backoff: Backoff<String>,
}

impl AttachDriver {
    /// A driver whose first apply reads everything back.
    pub fn new(io: Box<dyn Attacher>) -> Self {
        Self {
            io,
            links: BTreeMap::new(),
            down: BTreeSet::new(),
            dirty: BTreeSet::new(),
            in_place: BTreeSet::new(),
            resync: true,
            stats: AttachStats::default(),
            backoff: Backoff::default(),
        }
    }

    /// Manager side: a workload link exists (or changed index, or came up). No kernel I/O.
    pub fn link_up(&mut self, ifname: &str, ifindex: u32, up: bool) {
        let changed_state = if up {
            self.down.remove(ifname)
        } else {
            self.down.insert(ifname.to_owned())
        };
        let new_index = self.links.insert(ifname.to_owned(), ifindex) != Some(ifindex);
        if new_index {
            // A new interface under this name: an earlier failure says nothing about it.
            self.backoff.succeeded(&ifname.to_owned());
            self.in_place.remove(ifname);
        }
        if new_index || changed_state {
            self.dirty.insert(ifname.to_owned());
        }
    }

    /// Manager side: a workload link is gone. No kernel I/O.
    pub fn link_gone(&mut self, ifname: &str) {
        self.down.remove(ifname);
        self.in_place.remove(ifname);
        if self.links.remove(ifname).is_some() {
            self.dirty.insert(ifname.to_owned());
        }
    }

    /// The workload links known.
    pub fn links(&self) -> &BTreeMap<String, u32> {
        &self.links
    }

    /// Program changed (new object): re-read everything.
    pub fn request_resync(&mut self) {
        self.resync = true;
    }

    /// A periodic refresh: the next apply reads every link's hooks back (and the link pins), and
    /// re-attaches what was removed from outside (counted in [`AttachStats::repairs`]).
    pub fn refresh(&mut self) {
        self.resync = true;
    }

    /// The kernel said something changed at a hook of link `ifindex` (a filter or qdisc deleted):
    /// the next apply reads that link back. No kernel I/O.
    pub fn check(&mut self, ifindex: u32) {
        if let Some((ifname, _)) = self.links.iter().find(|(_, i)| **i == ifindex) {
            self.dirty.insert(ifname.clone());
        }
    }

    /// True when an apply has work to do.
    pub fn is_dirty(&self) -> bool {
        self.resync || !self.dirty.is_empty()
    }

    /// Counters.
    pub fn stats(&self) -> AttachStats {
        self.stats
    }

    /// Reconciles. With `only_new` (before the first in-sync), only attaches to links that have no
    /// attachment at all — attaching the deny-by-default programs only closes — and never unpins.
    /// A failing link does not stop the others: it stays dirty and the first error is returned.
    pub fn apply(&mut self, only_new: bool) -> Result<(), KernelError> {
        match self.reconcile(only_new, None).error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Like [`AttachDriver::apply`], leaving alone the links in backoff at `now` (a link whose
    /// attachment failed is retried after a growing delay). Returns what is left to do.
    pub fn apply_due(&mut self, only_new: bool, now: Instant) -> Pending {
        self.reconcile(only_new, Some(now))
    }

    /// Links with work owed.
    pub fn pending_links(&self) -> usize {
        self.dirty.len()
    }

    /// True when some link's attachment failed and is waiting for its retry.
    pub fn has_failures(&self) -> bool {
        !self.backoff.is_empty()
    }

    fn reconcile(&mut self, only_new: bool, now: Option<Instant>) -> Pending {
        let mut pending = Pending {
            driver: "attachments".to_owned(),
            ..Pending::default()
        };
        self.apply_inner(only_new, now, &mut pending);
        if pending.error.is_some() {
            self.stats.errors += 1;
        }
        pending.retry_at = self.backoff.next_due();
        pending
    }

    fn apply_inner(&mut self, only_new: bool, now: Option<Instant>, pending: &mut Pending) {
        let resync = self.resync && !only_new;
        let mut todo: BTreeSet<String> = std::mem::take(&mut self.dirty);
        let mut resynced = resync;
        if resync {
            match self.io.pinned() {
                Ok(pins) => {
                    for (ifname, program) in pins {
                        if !self.links.contains_key(&ifname)
                            && HOOKS.iter().any(|(p, _)| *p == program)
                        {
                            // Retried through the link's own reconcile (`unpin_all`).
                            todo.insert(ifname);
                        }
                    }
                }
                Err(e) => {
                    pending.failed += 1;
                    pending.error.get_or_insert(e);
                    resynced = false;
                }
            }
            todo.extend(self.links.keys().cloned());
        }
        let at = || now.unwrap_or_else(Instant::now);
        for ifname in &todo {
            if let Some(now) = now
                && !self.backoff.is_due(ifname, now)
            {
                pending.waiting += 1;
                self.dirty.insert(ifname.clone());
                continue;
            }
            match self.reconcile_link(ifname, only_new) {
                Ok(()) => self.backoff.succeeded(ifname),
                Err(e) => {
                    tracing::debug!(ifname, error = %e, "attachment failed; retrying with backoff");
                    pending.failed += 1;
                    pending.error.get_or_insert(e);
                    self.backoff.failed(ifname, at());
                    self.dirty.insert(ifname.clone());
                }
            }
        }
        if only_new {
            // Only attaches were done: updates and unpins of these links are still owed.
            self.dirty.extend(todo);
        }
        if resynced {
            self.resync = false;
        }
    }

    fn reconcile_link(&mut self, ifname: &str, only_new: bool) -> Result<(), KernelError> {
        let Some(&ifindex) = self.links.get(ifname) else {
            if !only_new {
                self.unpin_all(ifname)?;
            }
            return Ok(());
        };
        let was_in_place = self.in_place.remove(ifname);
        for (program, hook) in HOOKS {
            let current = self.io.current(program);
            let state = match self.io.hook(ifname, ifindex, program, hook) {
                Ok(state) => state,
                Err(_) if !self.io.link_exists(ifname, ifindex) => {
                    return self.forget_vanished(ifname, only_new);
                }
                Err(e) => return Err(e),
            };
            if state.ours.is_none() && !self.io.link_exists(ifname, ifindex) {
                // The interface is gone (the watcher will say so too): nothing to attach to, and
                // its pins only hold dead links.
                return self.forget_vanished(ifname, only_new);
            }
            match state.ours {
                Some(id) => {
                    if id != current && !only_new {
                        self.io.update(ifname, ifindex, program, hook)?;
                        self.stats.updates += 1;
                        if was_in_place {
                            self.repaired(
                                ifname,
                                program,
                                &format!("program {id} instead of {current}"),
                            );
                        }
                    }
                }
                // Nothing of ours: whatever else is there stays until ours is in place.
                None if self.down.contains(ifname) => continue,
                None => {
                    self.io.attach(ifname, ifindex, program, hook)?;
                    self.stats.attaches += 1;
                    if was_in_place {
                        self.repaired(ifname, program, "no program attached");
                    }
                }
            }
            if state.leftovers && !only_new {
                self.stats.unpins += self.io.sweep(ifname, ifindex, program, hook)?;
            }
        }
        if !self.down.contains(ifname) {
            self.in_place.insert(ifname.to_owned());
        }
        Ok(())
    }

    /// Counts and logs one repair of `program` on `ifname`.
    fn repaired(&mut self, ifname: &str, program: &str, found: &str) {
        self.stats.repairs += 1;
        tracing::warn!(
            ifname,
            program,
            found,
            "workload attachment tampered with from outside; re-attached"
        );
    }

    fn unpin_all(&mut self, ifname: &str) -> Result<(), KernelError> {
        for (program, _) in HOOKS {
            if self.io.has_pin(ifname, program) {
                self.io.unpin(ifname, program)?;
                self.stats.unpins += 1;
            }
        }
        Ok(())
    }
}

impl AttachDriver {
    /// A link vanished before its link-gone event: drop it from the desired links and (after the
    /// first in-sync) remove its pins, so one dead interface never holds up the apply.
    fn forget_vanished(&mut self, ifname: &str, only_new: bool) -> Result<(), KernelError> {
        tracing::debug!(ifname, "workload link vanished; forgetting it");
        self.links.remove(ifname);
        self.in_place.remove(ifname);
        self.down.remove(ifname);
        if only_new {
            return Ok(());
        }
        self.unpin_all(ifname)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::kernel::fake::FakeKernel as Fake;

    fn key(ifname: &str, program: &str) -> (String, String) {
        (ifname.to_owned(), program.to_owned())
    }

    #[test]
    fn the_other_mechanisms_attachment_goes_only_once_ours_is_in_place() {
        let f = fake();
        {
            let mut s = f.tc();
            s.other.insert(key("weira", FROM_ENDPOINT));
            s.other.insert(key("weirb", FROM_ENDPOINT));
        }
        let mut d = AttachDriver::new(Box::new(f.clone()));
        d.link_up("weira", 10, true);
        d.link_up("weirb", 11, false);
        d.apply(true).expect("pre-in-sync");
        assert_eq!(d.stats().unpins, 0, "nothing is removed before in-sync");
        d.apply(false).expect("apply");
        let s = f.tc();
        assert!(
            !s.other.contains(&key("weira", FROM_ENDPOINT)),
            "replaced by ours"
        );
        assert!(
            s.other.contains(&key("weirb", FROM_ENDPOINT)),
            "a down link keeps what it has until ours is attached"
        );
        assert_eq!(d.stats().unpins, 1);
        assert_eq!(d.stats().attaches, 2);
    }

    #[test]
    fn a_link_that_vanished_before_its_event_does_not_hold_up_the_apply() {
        let f = fake();
        let mut d = AttachDriver::new(Box::new(f.clone()));
        d.link_up("weira", 10, true);
        d.apply(false).expect("apply");
        // weira dies with its pod; the watcher has not said so yet; a stale pin is left.
        f.remove_link("weira");
        d.link_up("weira", 10, true);
        d.request_resync();
        d.apply(false).expect("a vanished link is no error");
        assert!(d.links().is_empty(), "the vanished link is forgotten");
        assert!(f.tc().pins.is_empty(), "its dead pins are removed");
    }

    fn fake() -> Fake {
        let f = Fake::default();
        {
            let mut s = f.tc();
            s.current = 7;
            s.ifindex.insert("weira".into(), 10);
            s.ifindex.insert("weirb".into(), 11);
        }
        f
    }

    #[test]
    fn attaches_new_links_sweeps_orphans_and_a_restart_writes_nothing() {
        let f = fake();
        f.tc()
            .pins
            .insert(("weirgone".into(), FROM_ENDPOINT.into()), 7);
        let mut d = AttachDriver::new(Box::new(f.clone()));
        d.link_up("weira", 10, true);
        d.apply(true).expect("pre-in-sync: attach only");
        assert_eq!(d.stats().attaches, 2);
        assert_eq!(d.stats().unpins, 0, "nothing is removed before in-sync");
        d.link_up("weirb", 11, true);
        d.apply(false).expect("apply");
        assert_eq!(d.stats().attaches, 4);
        assert_eq!(d.stats().unpins, 1, "the orphan pin is swept");

        // A new agent over the same kernel state writes nothing.
        let ops = f.tc().ops;
        let mut again = AttachDriver::new(Box::new(f.clone()));
        again.link_up("weira", 10, true);
        again.link_up("weirb", 11, true);
        again.apply(false).expect("apply");
        assert_eq!(
            f.tc().ops,
            ops,
            "restart over unchanged state: no kernel writes"
        );
    }

    #[test]
    fn a_link_that_is_not_up_gets_nothing_until_it_is_and_is_not_swept() {
        let f = fake();
        f.tc()
            .pins
            .insert(("weirb".into(), FROM_ENDPOINT.into()), 7);
        f.tc().attached.insert((11, "Ingress".into(), 7));
        let mut d = AttachDriver::new(Box::new(f.clone()));
        d.link_up("weira", 10, false);
        d.link_up("weirb", 11, false);
        d.apply(false).expect("apply");
        assert_eq!(d.stats().attaches, 0, "links that are not up wait");
        assert_eq!(
            d.stats().unpins,
            0,
            "the CNI's pin on a down link is not an orphan"
        );
        d.link_up("weira", 10, true);
        d.link_up("weirb", 11, true);
        d.apply(false).expect("apply");
        assert_eq!(
            d.stats().attaches,
            3,
            "both of weira's, and weirb's missing egress program"
        );
    }

    #[test]
    fn a_new_program_is_swapped_in_through_the_links_and_stale_pins_are_replaced() {
        let f = fake();
        let mut d = AttachDriver::new(Box::new(f.clone()));
        d.link_up("weira", 10, true);
        d.apply(false).expect("apply");
        f.tc().current = 8;
        d.request_resync();
        d.apply(false).expect("apply");
        assert_eq!(d.stats().updates, 2, "both links updated in place");
        // Interface recreated with a new index under the same name: the pins are stale.
        f.tc().ifindex.insert("weira".into(), 20);
        d.link_up("weira", 20, true);
        d.apply(false).expect("apply");
        assert_eq!(d.stats().attaches, 4);
        assert!(f.tc().attached.contains(&(20, "Ingress".into(), 8)));
    }
}
