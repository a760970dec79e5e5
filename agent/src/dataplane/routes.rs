//! The route driver (DESIGN.md → "Nodes and routing"): one route per remote pod block, owned by weir's
//! own route protocol number ([`crate::paths::ROUTE_PROTOCOL`]) in the main table. Like every driver it
//! reads its routes back, writes only what is missing or different, and sweeps routes of its protocol that
//! nothing wants any more; routes of any other protocol are never touched, and a restart over unchanged state
//! writes nothing.

use std::collections::BTreeMap;

use ipnetwork::IpNetwork;

use super::map_driver::DriverStats;
pub use crate::kernel::{NextHop, RouteError, RouteIo};

/// Desired routes and their reconciliation.
pub struct RouteDriver {
    io: Box<dyn RouteIo>,
    desired: BTreeMap<IpNetwork, NextHop>,
    stats: DriverStats,
    dirty: bool,
    /// The last apply succeeded and nothing desired changed since: whatever a read back finds
    /// different now was done from outside (drift, counted in `DriverStats::repairs`).
    in_sync: bool,
}

impl RouteDriver {
    /// A driver whose first apply reads everything back.
    #[must_use]
    pub fn new(io: Box<dyn RouteIo>) -> Self {
        Self {
            io,
            desired: BTreeMap::new(),
            stats: DriverStats::default(),
            dirty: true,
            in_sync: false,
        }
    }

    /// Replaces the desired routes (a manager's whole view: remote blocks → their next hops).
    pub fn set_desired(&mut self, desired: BTreeMap<IpNetwork, NextHop>) {
        if desired != self.desired {
            self.desired = desired;
            self.dirty = true;
            self.in_sync = false;
        }
    }

    /// A periodic refresh, or the kernel said a route of weir's protocol went: the next apply reads
    /// the table back and repairs what differs.
    pub fn refresh(&mut self) {
        self.dirty = true;
    }

    /// The desired routes.
    #[must_use]
    pub fn desired(&self) -> &BTreeMap<IpNetwork, NextHop> {
        &self.desired
    }

    /// True when the next apply has work to do.
    #[must_use]
    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// What it wrote and swept so far.
    #[must_use]
    pub fn stats(&self) -> DriverStats {
        self.stats
    }

    /// Reads back, writes what is missing or different, sweeps the rest. Every route is tried; the first
    /// failure is returned and the driver stays dirty, so the next apply retries what is still wrong.
    pub fn apply(&mut self) -> Result<(), RouteError> {
        if !self.dirty {
            return Ok(());
        }
        self.stats.resyncs += 1;
        let present = match self.io.dump() {
            Ok(p) => p,
            Err(e) => {
                self.stats.errors += 1;
                return Err(e);
            }
        };
        if self.in_sync {
            self.count_drift(&present);
        }
        let mut first_error = None;
        for (dest, hop) in &self.desired {
            if present.get(dest) == Some(hop) {
                continue;
            }
            match self.io.replace(*dest, *hop) {
                Ok(()) => self.stats.writes += 1,
                Err(e) => {
                    self.stats.errors += 1;
                    first_error.get_or_insert(e);
                }
            }
        }
        for (dest, hop) in &present {
            if self.desired.contains_key(dest) {
                continue;
            }
            match self.io.delete(*dest, *hop) {
                Ok(()) => self.stats.deletes += 1,
                Err(e) => {
                    self.stats.errors += 1;
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            None => {
                self.dirty = false;
                self.in_sync = true;
                Ok(())
            }
            Some(e) => {
                self.in_sync = false;
                Err(e)
            }
        }
    }

    /// Counts and logs what differs from the table the driver had in sync.
    fn count_drift(&mut self, present: &BTreeMap<IpNetwork, NextHop>) {
        let missing: Vec<&IpNetwork> = self
            .desired
            .keys()
            .filter(|d| !present.contains_key(*d))
            .collect();
        let altered: Vec<&IpNetwork> = self
            .desired
            .iter()
            .filter(|(d, h)| present.get(*d).is_some_and(|p| p != *h))
            .map(|(d, _)| d)
            .collect();
        let extra: Vec<&IpNetwork> = present
            .keys()
            .filter(|d| !self.desired.contains_key(*d))
            .collect();
        let found = missing.len() + altered.len() + extra.len();
        if found == 0 {
            return;
        }
        self.stats.repairs += found as u64;
        tracing::warn!(
            driver = "routes",
            missing = ?missing,
            altered = ?altered,
            extra = ?extra,
            "drift found in weir's routes; repairing"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::fake::FakeKernel;

    fn net(s: &str) -> IpNetwork {
        s.parse().expect("cidr")
    }

    fn via(s: &str) -> NextHop {
        NextHop::Via(s.parse().expect("ip"))
    }

    #[test]
    fn writes_what_is_missing_sweeps_orphans_and_a_restart_writes_nothing() {
        let kernel = FakeKernel::default();
        kernel
            .routes()
            .routes
            .insert(net("10.9.0.0/26"), via("192.0.2.9"));
        let mut driver = RouteDriver::new(Box::new(kernel.clone()));
        let want = BTreeMap::from([
            (net("10.244.1.0/26"), via("192.0.2.2")),
            (net("10.244.2.0/26"), via("192.0.2.3")),
        ]);
        driver.set_desired(want.clone());
        driver.apply().expect("apply");
        assert_eq!(kernel.routes().routes, want, "the orphan is swept");
        assert_eq!((driver.stats().writes, driver.stats().deletes), (2, 1));
        // A restarted driver over the same table writes nothing.
        let mut restarted = RouteDriver::new(Box::new(kernel.clone()));
        restarted.set_desired(want.clone());
        restarted.apply().expect("apply");
        assert_eq!(
            (restarted.stats().writes, restarted.stats().deletes),
            (0, 0)
        );
        // A next hop that changed is replaced; nothing else is written.
        let mut moved = want;
        moved.insert(net("10.244.2.0/26"), via("192.0.2.4"));
        restarted.set_desired(moved.clone());
        restarted.apply().expect("apply");
        assert_eq!(restarted.stats().writes, 1);
        assert_eq!(kernel.routes().routes, moved);
    }

    #[test]
    fn a_failing_route_stays_dirty_while_the_others_are_written() {
        let kernel = FakeKernel::default();
        kernel.routes().failing.insert(net("10.244.1.0/26"));
        let mut driver = RouteDriver::new(Box::new(kernel.clone()));
        driver.set_desired(BTreeMap::from([
            (net("10.244.1.0/26"), via("192.0.2.2")),
            (net("10.244.2.0/26"), via("192.0.2.3")),
        ]));
        assert!(driver.apply().is_err());
        assert!(kernel.routes().routes.contains_key(&net("10.244.2.0/26")));
        kernel.routes().failing.clear();
        driver.apply().expect("the retry succeeds");
        assert_eq!(kernel.routes().routes.len(), 2);
    }

    #[test]
    fn a_refresh_repairs_routes_changed_from_outside_and_counts_only_those() {
        let kernel = FakeKernel::default();
        let mut driver = RouteDriver::new(Box::new(kernel.clone()));
        let want = BTreeMap::from([
            (net("10.244.1.0/26"), via("192.0.2.2")),
            (net("10.244.2.0/26"), via("192.0.2.3")),
        ]);
        driver.set_desired(want.clone());
        driver.apply().expect("apply");
        assert_eq!(driver.stats().repairs, 0, "the first apply is no repair");
        // `ip route del` of one, another's next hop changed, a stray route of weir's protocol.
        {
            let mut r = kernel.routes();
            r.routes.remove(&net("10.244.1.0/26"));
            r.routes.insert(net("10.244.2.0/26"), via("192.0.2.9"));
            r.routes.insert(net("10.9.0.0/26"), via("192.0.2.9"));
        }
        driver.apply().expect("clean: nothing read back");
        assert_ne!(kernel.routes().routes, want, "no refresh yet");
        driver.refresh();
        driver.apply().expect("apply");
        assert_eq!(kernel.routes().routes, want);
        assert_eq!(driver.stats().repairs, 3);
        // A desired change is not drift.
        let mut moved = want;
        moved.insert(net("10.244.3.0/26"), via("192.0.2.4"));
        driver.set_desired(moved);
        driver.apply().expect("apply");
        assert_eq!(driver.stats().repairs, 3);
    }
}
