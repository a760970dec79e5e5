//! The XDP prefilter, a driver the dataplane loop applies: deny CIDRs (from `--prefilter-deny` and
//! `--prefilter-deny-file`) in `prefilter4_v1`/`prefilter6_v1` through two map drivers (read back,
//! write what differs, sweep the rest), and `xdp_prefilter` on exactly the interfaces
//! `--prefilter-interfaces` names: a pinned link on any other interface is an orphan and its pin is
//! removed, which detaches it. A failing interface stays dirty and is retried with backoff; the
//! others proceed. The kernel side is the seam's [`XdpIo`] (`kernel::real::xdp::PinnedXdp`).

use std::{
    collections::{BTreeMap, BTreeSet},
    fs, io,
    net::IpAddr,
    path::{Path, PathBuf},
    time::Instant,
};

use attach::AttachMode;
use ipnetwork::IpNetwork;
use maps_schema::PrefilterEntry;

use super::{
    map_driver::{MapDriver, Pending},
    plane::ApplyError,
    retry::Backoff,
};
use crate::kernel::{KernelError, MapIo, Prefix, XdpIo};
use crate::paths::Paths;

/// A deny file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DenyFileError {
    /// The file cannot be read.
    #[error("cannot read the prefilter deny file {path}: {source}; check --prefilter-deny-file")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A line is not a CIDR.
    #[error(
        "{path}:{line}: {text:?} is not a CIDR (write one address or CIDR per line, such as 192.0.2.0/24 or 2001:db8::/32; # starts a comment)"
    )]
    Line {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The line.
        text: String,
    },
}

/// One CIDR as the operator writes it (`192.0.2.0/24`, a bare address is a /32 or /128),
/// normalised to its network address.
#[must_use]
pub fn parse_cidr(text: &str) -> Option<IpNetwork> {
    let net: IpNetwork = text.trim().parse().ok()?;
    IpNetwork::new(net.network(), net.prefix()).ok()
}

/// The CIDRs of a deny file: one per line; blank lines and `#` comments are skipped.
pub fn read_deny_file(path: &Path) -> Result<Vec<IpNetwork>, DenyFileError> {
    let text = fs::read_to_string(path).map_err(|source| DenyFileError::Read {
        path: path.to_owned(),
        source,
    })?;
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        out.push(parse_cidr(line).ok_or_else(|| DenyFileError::Line {
            path: path.to_owned(),
            line: i + 1,
            text: line.to_owned(),
        })?);
    }
    Ok(out)
}

/// One read of the file: its CIDRs, or why it was refused.
pub type DenyFileRead = Result<Vec<IpNetwork>, DenyFileError>;

/// Rule ids written with each CIDR (not interpreted by the program; shown by `bpftool`).
pub const RULE_FLAG: u32 = 1;
/// CIDRs from the deny file.
pub const RULE_FILE: u32 = 2;

/// The prefilter's drivers: deny maps and XDP attachments.
pub struct PrefilterDriver {
    xdp: Box<dyn XdpIo>,
    interfaces: BTreeSet<String>,
    dirty: BTreeSet<String>,
    resync: bool,
    backoff: Backoff<String>,
    deny4: MapDriver<Prefix<[u8; 4]>, PrefilterEntry>,
    deny6: MapDriver<Prefix<[u8; 16]>, PrefilterEntry>,
    modes: BTreeMap<String, AttachMode>,
    hold_deny: bool,
}

impl PrefilterDriver {
    /// Drivers over the seam; the first apply reads everything back.
    pub fn new(
        xdp: Box<dyn XdpIo>,
        deny4: Box<dyn MapIo<Prefix<[u8; 4]>, PrefilterEntry>>,
        deny6: Box<dyn MapIo<Prefix<[u8; 16]>, PrefilterEntry>>,
    ) -> Self {
        Self {
            xdp,
            interfaces: BTreeSet::new(),
            dirty: BTreeSet::new(),
            resync: true,
            backoff: Backoff::default(),
            deny4: MapDriver::new(deny4),
            deny6: MapDriver::new(deny6),
            modes: BTreeMap::new(),
            hold_deny: false,
        }
    }

    /// The interfaces that should run the prefilter. No kernel I/O.
    pub fn set_interfaces(&mut self, interfaces: impl IntoIterator<Item = String>) {
        let new: BTreeSet<String> = interfaces.into_iter().collect();
        self.dirty
            .extend(new.symmetric_difference(&self.interfaces).cloned());
        self.interfaces = new;
    }

    /// The deny CIDRs, each with its rule id. No kernel I/O; only changes become dirty.
    pub fn set_deny(&mut self, cidrs: impl IntoIterator<Item = (IpNetwork, u32)>) {
        let mut v4 = std::collections::HashMap::new();
        let mut v6 = std::collections::HashMap::new();
        for (net, rule_id) in cidrs {
            let value = PrefilterEntry { rule_id };
            let len = u32::from(net.prefix());
            match net.network() {
                IpAddr::V4(a) => {
                    v4.entry(Prefix {
                        len,
                        data: a.octets(),
                    })
                    .or_insert(value);
                }
                IpAddr::V6(a) => {
                    v6.entry(Prefix {
                        len,
                        data: a.octets(),
                    })
                    .or_insert(value);
                }
            }
        }
        self.deny4.replace_all(v4);
        self.deny6.replace_all(v6);
    }

    /// Number of deny CIDRs desired.
    pub fn deny_len(&self) -> usize {
        self.deny4.len() + self.deny6.len()
    }

    /// While set, the deny maps are left as the kernel holds them (no deny set is known yet:
    /// the deny file was refused at start).
    pub fn hold_deny(&mut self, hold: bool) {
        self.hold_deny = hold;
    }

    /// True when an apply has work to do.
    pub fn is_dirty(&self) -> bool {
        self.resync
            || !self.dirty.is_empty()
            || (!self.hold_deny && (self.deny4.is_dirty() || self.deny6.is_dirty()))
    }

    /// The next apply reads the maps and the link pins back in full.
    pub fn request_resync(&mut self) {
        self.resync = true;
        self.deny4.request_resync();
        self.deny6.request_resync();
    }

    /// How each named interface's prefilter was attached by the applies so far.
    pub fn modes(&self) -> Vec<(String, AttachMode)> {
        self.modes.iter().map(|(k, v)| (k.clone(), *v)).collect()
    }

    /// Reconciles: the deny maps first (a new interface then filters from its first packet),
    /// then attachments to the named interfaces, then removal of links on other interfaces.
    pub fn apply(&mut self) -> Result<(), ApplyError> {
        let now = Instant::now();
        let mut left = Vec::new();
        if !self.hold_deny {
            left.push(self.deny4.apply_due(now, &|_, _| true));
            left.push(self.deny6.apply_due(now, &|_, _| true));
        }
        left.push(self.apply_links(now));
        ApplyError::from_pending(left)
    }

    fn apply_links(&mut self, now: Instant) -> Pending {
        let mut pending = Pending {
            driver: "prefilter attachments".to_owned(),
            ..Pending::default()
        };
        let mut todo = std::mem::take(&mut self.dirty);
        if self.resync {
            match self.xdp.pinned() {
                Ok(pinned) => {
                    todo.extend(pinned);
                    todo.extend(self.interfaces.iter().cloned());
                    self.resync = false;
                }
                Err(e) => {
                    pending.failed += 1;
                    pending.error = Some(e);
                    todo.extend(self.interfaces.iter().cloned());
                }
            }
        }
        for ifname in todo {
            if !self.backoff.is_due(&ifname, now) {
                pending.waiting += 1;
                self.dirty.insert(ifname);
                continue;
            }
            match self.reconcile(&ifname) {
                Ok(()) => self.backoff.succeeded(&ifname),
                Err(e) => {
                    tracing::warn!(ifname, error = %e, "prefilter attachment failed; retrying with backoff");
                    pending.failed += 1;
                    pending.error.get_or_insert(e);
                    self.backoff.failed(&ifname, now);
                    self.dirty.insert(ifname);
                }
            }
        }
        pending.retry_at = self.backoff.next_due();
        pending
    }

    fn reconcile(&mut self, ifname: &str) -> Result<(), KernelError> {
        if !self.interfaces.contains(ifname) {
            if self.xdp.pinned_program(ifname).is_some() || self.has_pin(ifname)? {
                self.xdp.unpin(ifname)?;
                tracing::info!(
                    ifname,
                    "detached xdp_prefilter from an interface no longer named"
                );
            }
            self.modes.remove(ifname);
            return Ok(());
        }
        let current = self.xdp.current();
        if self.xdp.pinned_program(ifname) == Some(current) && self.xdp.pin_is_live(ifname) {
            self.modes
                .entry(ifname.to_owned())
                .or_insert(AttachMode::Unchanged);
            return Ok(());
        }
        if self.xdp.pinned_program(ifname).is_some() && !self.xdp.pin_is_live(ifname) {
            // The interface was recreated under this name: the pin holds a defunct link.
            self.xdp.unpin(ifname)?;
        }
        let mode = self.xdp.attach(ifname)?;
        tracing::info!(ifname, ?mode, "attached xdp_prefilter");
        self.modes.insert(ifname.to_owned(), mode);
        Ok(())
    }

    fn has_pin(&self, ifname: &str) -> Result<bool, KernelError> {
        Ok(self.xdp.pinned()?.iter().any(|p| p == ifname))
    }
}

/// Errors opening the prefilter.
#[derive(Debug, thiserror::Error)]
pub enum PrefilterError {
    /// The program or a deny map could not be opened.
    #[error(transparent)]
    Kernel(#[from] KernelError),
    /// The first apply left an interface without the prefilter (e.g. one that does not exist).
    #[error("cannot set up the XDP prefilter: {0}; check --prefilter-interfaces")]
    Apply(String),
}

/// The prefilter as the loop drives it (the node holds it): the driver with the interfaces and the
/// deny set it should have, made of `--prefilter-deny`'s CIDRs and the deny file's last good read
/// (`sources::prefilter_file` sends each read as a command).
pub struct Prefilter {
    driver: PrefilterDriver,
    flag: Vec<IpNetwork>,
}

impl Prefilter {
    /// Over the real kernel: the pinned program and deny maps, opened (nothing attached or written
    /// until the loop applies).
    pub fn open(
        paths: &Paths,
        interfaces: &[String],
        deny: &[String],
        file: Option<&DenyFileRead>,
    ) -> Result<Self, PrefilterError> {
        use crate::kernel::PinnedLpm;
        use maps_schema::maps::{PREFILTER4, PREFILTER6};
        let driver = PrefilterDriver::new(
            Box::new(crate::kernel::real::xdp::PinnedXdp::open(paths)?),
            Box::new(PinnedLpm::open(PREFILTER4, &paths.map_pin(PREFILTER4))?),
            Box::new(PinnedLpm::open(PREFILTER6, &paths.map_pin(PREFILTER6))?),
        );
        Ok(Self::new(driver, interfaces, deny, file))
    }

    /// The prefilter over `driver`: the named interfaces, the flag's CIDRs and the deny file's
    /// first read (`None`: no file). A refused first read leaves the deny maps as the kernel holds
    /// them (the last good set is what they hold) until a good read.
    pub fn new(
        mut driver: PrefilterDriver,
        interfaces: &[String],
        deny: &[String],
        file: Option<&DenyFileRead>,
    ) -> Self {
        driver.set_interfaces(interfaces.iter().cloned());
        let mut this = Self {
            driver,
            flag: deny.iter().filter_map(|c| parse_cidr(c)).collect(),
        };
        match file {
            None => this.set(&[]),
            Some(Ok(set)) => this.set(set),
            Some(Err(e)) => {
                tracing::error!(error = %e, "prefilter deny file refused; the deny maps keep what they hold until it is fixed");
                this.driver.hold_deny(true);
            }
        }
        this
    }

    /// A new read of the deny file: a good one replaces the file's CIDRs; a refused one is
    /// logged and the last good set stays. No kernel I/O.
    pub fn set_file(&mut self, read: DenyFileRead) {
        match read {
            Ok(set) => {
                self.driver.hold_deny(false);
                self.set(&set);
                tracing::info!(
                    cidrs = self.driver.deny_len(),
                    "prefilter deny file reloaded"
                );
            }
            Err(e) => {
                tracing::warn!(error = %e, "prefilter deny file refused; the last good deny set stays in force");
            }
        }
    }

    fn set(&mut self, from_file: &[IpNetwork]) {
        let flag = self.flag.iter().map(|n| (*n, RULE_FLAG));
        self.driver
            .set_deny(flag.chain(from_file.iter().map(|n| (*n, RULE_FILE))));
    }

    /// True when an apply has work to do.
    pub fn is_dirty(&self) -> bool {
        self.driver.is_dirty()
    }

    /// The next apply reads the deny maps and the link pins back in full.
    pub fn refresh(&mut self) {
        self.driver.request_resync();
    }

    /// Reconciles (the loop calls this on its thread).
    pub fn apply(&mut self) -> Result<(), ApplyError> {
        self.driver.apply()
    }

    /// How each named interface's prefilter was attached by the applies so far.
    pub fn modes(&self) -> Vec<(String, AttachMode)> {
        self.driver.modes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::fake::FakeKernel;

    fn driver(
        k: &FakeKernel,
    ) -> (
        PrefilterDriver,
        crate::kernel::fake::FakeMap<Prefix<[u8; 4]>, PrefilterEntry>,
    ) {
        let deny4 = k.map("prefilter4_v1");
        let d = PrefilterDriver::new(
            Box::new(k.clone()),
            Box::new(deny4.clone()),
            Box::new(k.map::<Prefix<[u8; 16]>, PrefilterEntry>("prefilter6_v1")),
        );
        (d, deny4)
    }

    fn net(s: &str) -> IpNetwork {
        parse_cidr(s).expect("cidr")
    }

    #[test]
    fn deny_cidrs_are_read_back_written_and_swept() {
        let k = FakeKernel::default();
        let (mut d, deny4) = driver(&k);
        let stale = Prefix {
            len: 8,
            data: [198, 0, 0, 0],
        };
        deny4.preload(&[(stale, PrefilterEntry { rule_id: 1 })]);
        d.set_deny([
            (net("10.246.0.7/24"), RULE_FILE),
            (net("192.0.2.1"), RULE_FLAG),
        ]);
        d.apply().expect("apply");
        assert_eq!(
            deny4.contents(),
            vec![
                (
                    Prefix {
                        len: 24,
                        data: [10, 246, 0, 0]
                    },
                    PrefilterEntry { rule_id: RULE_FILE }
                ),
                (
                    Prefix {
                        len: 32,
                        data: [192, 0, 2, 1]
                    },
                    PrefilterEntry { rule_id: RULE_FLAG }
                ),
            ],
            "normalised, written, and the stale CIDR swept"
        );
        let writes = deny4.mutations();
        d.set_deny([
            (net("10.246.0.0/24"), RULE_FILE),
            (net("192.0.2.1/32"), RULE_FLAG),
        ]);
        assert!(!d.is_dirty(), "the same set is no change");
        d.apply().expect("apply");
        assert_eq!(deny4.mutations(), writes);
    }

    #[test]
    fn links_on_interfaces_no_longer_named_are_removed_and_a_failing_one_does_not_block() {
        let k = FakeKernel::default();
        {
            let mut x = k.xdp();
            x.current = 5;
            x.interfaces.extend(["eth1".to_owned(), "eth2".to_owned()]);
            // A link of an earlier run on an interface the operator no longer names.
            x.pins.insert("eth9".into(), 5);
        }
        let (mut d, _) = driver(&k);
        d.set_interfaces(["eth1".to_owned(), "eth2".to_owned(), "eth3".to_owned()]);
        let err = d.apply().expect_err("eth3 does not exist");
        assert!(err.to_string().contains("eth3"), "{err}");
        assert_eq!(
            k.xdp().pins.keys().cloned().collect::<Vec<_>>(),
            vec!["eth1".to_owned(), "eth2".to_owned()],
            "the named interfaces run the prefilter; the orphan is detached"
        );
        assert_eq!(
            d.modes(),
            vec![
                ("eth1".to_owned(), AttachMode::NewLink),
                ("eth2".to_owned(), AttachMode::NewLink)
            ]
        );
        // A restart naming only eth1: eth2's link goes, eth1's is unchanged.
        let (mut again, _) = driver(&k);
        again.set_interfaces(["eth1".to_owned()]);
        again.apply().expect("apply");
        assert_eq!(
            k.xdp().pins.keys().cloned().collect::<Vec<_>>(),
            vec!["eth1".to_owned()]
        );
        assert_eq!(
            again.modes(),
            vec![("eth1".to_owned(), AttachMode::Unchanged)]
        );
        // eth1 recreated under the same name: its pin holds a defunct link, replaced by a new one.
        k.xdp().defunct.insert("eth1".into());
        let (mut recreated, _) = driver(&k);
        recreated.set_interfaces(["eth1".to_owned()]);
        recreated.apply().expect("apply");
        assert_eq!(
            recreated.modes(),
            vec![("eth1".to_owned(), AttachMode::NewLink)]
        );
        assert!(!k.xdp().defunct.contains("eth1"));
        // A new program replaces through the pin.
        k.xdp().current = 6;
        let (mut upgraded, _) = driver(&k);
        upgraded.set_interfaces(["eth1".to_owned()]);
        upgraded.apply().expect("apply");
        assert_eq!(upgraded.modes()[0].1, AttachMode::Replaced);
        assert_eq!(k.xdp().pins["eth1"], 6);
    }

    #[test]
    fn a_deny_file_refused_at_start_leaves_the_maps_as_they_are_until_it_is_fixed() {
        use crate::sources::prefilter_file::DenyFile;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("deny");
        std::fs::write(&path, "bogus\n").expect("write");
        let k = FakeKernel::default();
        let (d, deny4) = driver(&k);
        let last_good = Prefix {
            len: 24,
            data: [10, 246, 0, 0],
        };
        deny4.preload(&[(last_good, PrefilterEntry { rule_id: RULE_FILE })]);
        let (mut file, first) = DenyFile::first_read(path.clone());
        let mut p = Prefilter::new(d, &[], &[], Some(&first));
        p.apply().expect("starts");
        assert_eq!(deny4.contents().len(), 1, "the pinned set is kept");
        assert_eq!(deny4.mutations(), 0);
        let reads = file.reads();
        let counts = || {
            use std::sync::atomic::Ordering::Relaxed;
            (reads.applied.load(Relaxed), reads.refused.load(Relaxed))
        };
        assert_eq!(counts(), (0, 1), "the refusal is counted");
        std::fs::write(&path, "10.1.0.0/16\n").expect("write");
        p.set_file(file.poll().expect("the file changed"));
        assert_eq!(counts(), (1, 1), "and so is the good file");
        p.apply().expect("apply");
        assert_eq!(
            deny4.contents(),
            vec![(
                Prefix {
                    len: 16,
                    data: [10, 1, 0, 0]
                },
                PrefilterEntry { rule_id: RULE_FILE }
            )],
            "a good file replaces it"
        );
    }

    #[test]
    fn a_bad_line_names_the_file_and_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("deny");
        std::fs::write(&path, "# deny list\n10.0.0.0/8\n\n2001:db8::/32 # docs\n").expect("write");
        let got = read_deny_file(&path).expect("valid file");
        assert_eq!(got, vec![net("10.0.0.0/8"), net("2001:db8::/32")]);
        std::fs::write(&path, "10.0.0.0/8\n10.0.0.300/8\n").expect("write");
        let err = read_deny_file(&path).expect_err("bad line").to_string();
        assert!(err.contains(&format!("{}:2:", path.display())), "{err}");
    }
}
