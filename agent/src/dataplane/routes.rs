//! The route driver (DESIGN.md → "Nodes and routing"): one route per remote pod block, owned by weir's
//! own route protocol number ([`crate::paths::ROUTE_PROTOCOL`]) in the main table. Like every driver it
//! reads its routes back, writes only what is missing or different, and sweeps routes of its protocol that
//! nothing wants any more; routes of any other protocol are never touched, and a restart over unchanged state
//! writes nothing.

use std::{collections::BTreeMap, net::IpAddr};

use ipnetwork::IpNetwork;
use serde::Serialize;

use super::map_driver::DriverStats;

/// Where a route sends its block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum NextHop {
    /// Native routing: via the remote node's address (on a shared L2, or a fabric that routes pod CIDRs).
    Via(IpAddr),
    /// Tunnel routing: through a device (the VXLAN device, by ifindex), `onlink` via the remote node's
    /// tunnel address.
    Device {
        /// The device.
        ifindex: u32,
        /// The remote end's address on the tunnel.
        via: IpAddr,
    },
}

/// A route-table failure.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    /// A netlink request failed.
    #[error("cannot {op} the route to {dest}: {source}")]
    Netlink {
        /// What was done.
        op: &'static str,
        /// The destination (or `*` for a dump).
        dest: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// The kernel's route table as the driver sees it (weir's protocol only).
pub trait RouteIo: Send {
    /// Every route of weir's protocol in the main table.
    fn dump(&mut self) -> Result<BTreeMap<IpNetwork, NextHop>, RouteError>;
    /// Creates or replaces the route to `dest`.
    fn replace(&mut self, dest: IpNetwork, hop: NextHop) -> Result<(), RouteError>;
    /// Deletes the route to `dest` (of weir's protocol).
    fn delete(&mut self, dest: IpNetwork, hop: NextHop) -> Result<(), RouteError>;
}

/// Desired routes and their reconciliation.
pub struct RouteDriver {
    io: Box<dyn RouteIo>,
    desired: BTreeMap<IpNetwork, NextHop>,
    stats: DriverStats,
    dirty: bool,
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
        }
    }

    /// Replaces the desired routes (a manager's whole view: remote blocks → their next hops).
    pub fn set_desired(&mut self, desired: BTreeMap<IpNetwork, NextHop>) {
        if desired != self.desired {
            self.desired = desired;
            self.dirty = true;
        }
    }

    /// The desired routes.
    #[must_use]
    pub fn desired(&self) -> &BTreeMap<IpNetwork, NextHop> {
        &self.desired
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
                Ok(())
            }
            Some(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// Routes and a destination whose writes fail.
    type Routes = (BTreeMap<IpNetwork, NextHop>, Option<IpNetwork>);

    /// The kernel's routes of weir's protocol, in memory, with a failing destination.
    #[derive(Clone, Default)]
    struct Table(Arc<Mutex<Routes>>);

    impl RouteIo for Table {
        fn dump(&mut self) -> Result<BTreeMap<IpNetwork, NextHop>, RouteError> {
            Ok(self.0.lock().expect("table").0.clone())
        }
        fn replace(&mut self, dest: IpNetwork, hop: NextHop) -> Result<(), RouteError> {
            let mut t = self.0.lock().expect("table");
            if t.1 == Some(dest) {
                return Err(RouteError::Netlink {
                    op: "replace",
                    dest: dest.to_string(),
                    source: std::io::Error::other("injected"),
                });
            }
            t.0.insert(dest, hop);
            Ok(())
        }
        fn delete(&mut self, dest: IpNetwork, _: NextHop) -> Result<(), RouteError> {
            self.0.lock().expect("table").0.remove(&dest);
            Ok(())
        }
    }

    fn net(s: &str) -> IpNetwork {
        s.parse().expect("cidr")
    }

    fn via(s: &str) -> NextHop {
        NextHop::Via(s.parse().expect("ip"))
    }

    #[test]
    fn writes_what_is_missing_sweeps_orphans_and_a_restart_writes_nothing() {
        let table = Table::default();
        table
            .0
            .lock()
            .expect("t")
            .0
            .insert(net("10.9.0.0/26"), via("192.0.2.9"));
        let mut driver = RouteDriver::new(Box::new(table.clone()));
        let want = BTreeMap::from([
            (net("10.244.1.0/26"), via("192.0.2.2")),
            (net("10.244.2.0/26"), via("192.0.2.3")),
        ]);
        driver.set_desired(want.clone());
        driver.apply().expect("apply");
        assert_eq!(table.0.lock().expect("t").0, want, "the orphan is swept");
        assert_eq!((driver.stats().writes, driver.stats().deletes), (2, 1));
        // A restarted driver over the same table writes nothing.
        let mut restarted = RouteDriver::new(Box::new(table.clone()));
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
        assert_eq!(table.0.lock().expect("t").0, moved);
    }

    #[test]
    fn a_failing_route_stays_dirty_while_the_others_are_written() {
        let table = Table::default();
        table.0.lock().expect("t").1 = Some(net("10.244.1.0/26"));
        let mut driver = RouteDriver::new(Box::new(table.clone()));
        driver.set_desired(BTreeMap::from([
            (net("10.244.1.0/26"), via("192.0.2.2")),
            (net("10.244.2.0/26"), via("192.0.2.3")),
        ]));
        assert!(driver.apply().is_err());
        assert!(
            table
                .0
                .lock()
                .expect("t")
                .0
                .contains_key(&net("10.244.2.0/26"))
        );
        table.0.lock().expect("t").1 = None;
        driver.apply().expect("the retry succeeds");
        assert_eq!(table.0.lock().expect("t").0.len(), 2);
    }
}
