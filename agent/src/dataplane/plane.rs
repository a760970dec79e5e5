//! The drivers together, applied in security order: attachments to new links first (they only
//! close), then identities, ipcache and policy, then the service maps (a frontend leads to
//! backends judged by their identities: written only once those maps are), and the endpoint
//! entries (whose isolation flags and addresses open an endpoint), so nothing is opened before
//! the policy that guards it is in place; program replacements and sweeps of attachments come last, once the maps the new
//! programs read are filled. A failing key or link stays dirty and is retried with backoff while
//! the other drivers proceed, except where that order requires waiting: an endpoint whose policy
//! entries or identities are not written is not opened, and programs are not replaced while a map
//! they read is not written.

use std::{collections::HashSet, time::Instant};

use maps_schema::{EndpointInfo, IdentityInfo, PolicyKey, PolicyValue};
use serde::Serialize;

use super::{
    attachments::{AttachDriver, AttachStats},
    endpoints::EndpointsManager,
    map_driver::{DriverStats, MapDriver, Pending},
    services::ServiceMaps,
};
use crate::kernel::Prefix;

/// Every driver and manager of the node.
pub struct Dataplane {
    /// tc attachments on workload links.
    pub attachments: AttachDriver,
    /// `endpoints_v1`.
    pub endpoints: MapDriver<u32, EndpointInfo>,
    /// Desired endpoint entries.
    pub endpoints_manager: EndpointsManager,
    /// `ident4_v1`: pod and node addresses → identity.
    pub ident4: MapDriver<[u8; 4], IdentityInfo>,
    /// `ident6_v1`.
    pub ident6: MapDriver<[u8; 16], IdentityInfo>,
    /// `ipcache4_v1`: policy CIDRs → CIDR identity.
    pub ipcache4: MapDriver<Prefix<[u8; 4]>, IdentityInfo>,
    /// `ipcache6_v1`.
    pub ipcache6: MapDriver<Prefix<[u8; 16]>, IdentityInfo>,
    /// `policy_v1`.
    pub policy: MapDriver<PolicyKey, PolicyValue>,
    /// The service maps (`svc4_v1`, slots, backends, reverse NAT).
    pub services: ServiceMaps,
}

/// Counters of every driver, for metrics and `weir status`.
#[derive(Clone, Debug, Serialize)]
pub struct DataplaneStats {
    /// Attachment driver.
    pub attachments: AttachStats,
    /// Map drivers by map name.
    pub maps: Vec<(String, DriverStats)>,
    /// Drift repaired, by driver (`tc-attachments`, each map, `routes`, `vxlan`).
    pub repairs: Vec<(String, u64)>,
}

impl Dataplane {
    /// The identity the programs would give `ip` on the desired state (exact, else LPM, else world).
    pub fn identity_of(&self, ip: std::net::IpAddr) -> u32 {
        use std::net::IpAddr;
        let exact = match ip {
            IpAddr::V4(a) => self.ident4.desired(&a.octets()).copied(),
            IpAddr::V6(a) => self.ident6.desired(&a.octets()).copied(),
        };
        let lpm = |best: Option<(u32, IdentityInfo)>, (len, info): (u32, IdentityInfo)| match best {
            Some((l, _)) if l >= len => best,
            _ => Some((len, info)),
        };
        let cidr = match ip {
            IpAddr::V4(a) => self
                .ipcache4
                .entries()
                .filter(|(p, _)| covers(&p.data, p.len, &a.octets()))
                .map(|(p, i)| (p.len, *i))
                .fold(None, lpm),
            IpAddr::V6(a) => self
                .ipcache6
                .entries()
                .filter(|(p, _)| covers(&p.data, p.len, &a.octets()))
                .map(|(p, i)| (p.len, *i))
                .fold(None, lpm),
        };
        exact
            .or(cidr.map(|(_, i)| i))
            .map_or(maps_schema::identity::WORLD, |i| i.identity)
    }

    /// True when an apply has work to do.
    pub fn is_dirty(&self) -> bool {
        self.attachments.is_dirty()
            || self.endpoints.is_dirty()
            || self.ident4.is_dirty()
            || self.ident6.is_dirty()
            || self.ipcache4.is_dirty()
            || self.ipcache6.is_dirty()
            || self.policy.is_dirty()
            || self.services.is_dirty()
    }

    /// A periodic refresh of every driver (Felix's refresh timers): the next apply reads each
    /// map and every workload link's hooks back and repairs what was changed from outside.
    pub fn refresh(&mut self) {
        self.attachments.refresh();
        self.endpoints.refresh();
        self.ident4.refresh();
        self.ident6.refresh();
        self.ipcache4.refresh();
        self.ipcache6.refresh();
        self.policy.refresh();
        self.services.refresh();
    }

    /// Before the first in-sync: only attach the deny-by-default programs to new workload links.
    pub fn apply_before_in_sync(&mut self) -> Result<(), ApplyError> {
        ApplyError::from_pending(vec![self.attachments.apply_due(true, Instant::now())])
    }

    /// A full apply, in security order: new links closed first; each map driver then writes what
    /// it can (a failing key stays dirty, in backoff, and does not stop the other keys or
    /// drivers); an endpoint entry is written only once its policy entries and identities are
    /// (and the shared CIDR identities): until then it stays closed; programs are replaced on
    /// existing links only once every map they read is written (a new object may bring new map
    /// versions). The error names every driver with work left.
    pub fn apply(&mut self) -> Result<(), ApplyError> {
        let written_before = self.map_writes();
        let result = self.apply_all();
        if self.map_writes().saturating_sub(written_before) >= crate::memory::TRIM_AFTER_WRITES {
            crate::memory::release_free();
        }
        result
    }

    /// Writes and deletes of every map driver so far.
    fn map_writes(&self) -> u64 {
        [
            self.endpoints.stats(),
            self.ident4.stats(),
            self.ident6.stats(),
            self.ipcache4.stats(),
            self.ipcache6.stats(),
            self.policy.stats(),
        ]
        .iter()
        .map(|s| s.writes + s.deletes)
        .sum::<u64>()
            + self.services.writes()
    }

    fn apply_all(&mut self) -> Result<(), ApplyError> {
        let now = Instant::now();
        let mut left = Vec::new();
        let attach_new = self.attachments.apply_due(true, now);
        left.push(self.ident4.apply_due(now, &|_, _| true));
        left.push(self.ident6.apply_due(now, &|_, _| true));
        left.push(self.ipcache4.apply_due(now, &|_, _| true));
        left.push(self.ipcache6.apply_due(now, &|_, _| true));
        left.push(self.policy.apply_due(now, &|_, _| true));
        let policy_in_place = left.iter().all(Pending::is_clean);
        left.extend(self.services.apply_due(now, policy_in_place));
        let gate = Gate::new(self);
        left.push(
            self.endpoints
                .apply_due(now, &|_, info: &EndpointInfo| gate.opens(info)),
        );
        let maps_written = left.iter().all(|p| p.failed == 0 && p.waiting == 0);
        if maps_written {
            // One report for both passes: a link that failed in the first waits in the second.
            let mut rest = self.attachments.apply_due(false, now);
            rest.waiting = rest.waiting.saturating_sub(attach_new.failed);
            rest.failed += attach_new.failed;
            rest.error = attach_new.error.or(rest.error);
            left.push(rest);
        } else {
            let mut held = attach_new;
            held.held += self.attachments.pending_links();
            left.push(held);
        }
        ApplyError::from_pending(left)
    }

    /// Counters.
    pub fn stats(&self) -> DataplaneStats {
        let mut maps = vec![
            (self.endpoints.name().to_owned(), self.endpoints.stats()),
            (self.ident4.name().to_owned(), self.ident4.stats()),
            (self.ident6.name().to_owned(), self.ident6.stats()),
            (self.ipcache4.name().to_owned(), self.ipcache4.stats()),
            (self.ipcache6.name().to_owned(), self.ipcache6.stats()),
            (self.policy.name().to_owned(), self.policy.stats()),
        ];
        maps.extend(self.services.stats());
        let attachments = self.attachments.stats();
        let repairs = std::iter::once(("tc-attachments".to_owned(), attachments.repairs))
            .chain(maps.iter().map(|(name, s)| (name.clone(), s.repairs)))
            .collect();
        DataplaneStats {
            attachments,
            maps,
            repairs,
        }
    }
}

/// What an apply left to do: every driver with failed, waiting or held work.
#[derive(Debug, thiserror::Error)]
pub struct ApplyError {
    /// The drivers with work left, in apply order.
    pub pending: Vec<Pending>,
}

impl ApplyError {
    pub(crate) fn from_pending(pending: Vec<Pending>) -> Result<(), Self> {
        let pending: Vec<Pending> = pending.into_iter().filter(|p| !p.is_clean()).collect();
        if pending.is_empty() {
            Ok(())
        } else {
            Err(Self { pending })
        }
    }

    /// The drivers that still have work.
    pub fn dirty_drivers(&self) -> Vec<&str> {
        self.pending.iter().map(|p| p.driver.as_str()).collect()
    }

    /// When the earliest item in backoff may be retried (`None`: retry on the next change).
    pub fn retry_at(&self) -> Option<Instant> {
        self.pending.iter().filter_map(|p| p.retry_at).min()
    }
}

impl std::fmt::Display for ApplyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the dataplane is not fully applied; retrying: ")?;
        for (i, p) in self.pending.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

/// Which endpoint entries may be written now: not one whose policy entries or own address
/// identities are still unwritten, and none while the kernel's copy of those maps is unknown or a
/// CIDR identity (shared by every endpoint's policy) is unwritten.
struct Gate {
    closed: bool,
    endpoint_ids: HashSet<u32>,
    addrs4: HashSet<[u8; 4]>,
    addrs6: HashSet<[u8; 16]>,
}

impl Gate {
    fn new(dp: &Dataplane) -> Self {
        let closed = !dp.policy.is_synced()
            || !dp.ident4.is_synced()
            || !dp.ident6.is_synced()
            || !dp.ipcache4.is_synced()
            || !dp.ipcache6.is_synced()
            || dp.ipcache4.pending_keys().next().is_some()
            || dp.ipcache6.pending_keys().next().is_some();
        Self {
            closed,
            endpoint_ids: dp.policy.pending_keys().map(|k| k.endpoint_id).collect(),
            addrs4: dp.ident4.pending_keys().copied().collect(),
            addrs6: dp.ident6.pending_keys().copied().collect(),
        }
    }

    fn opens(&self, info: &EndpointInfo) -> bool {
        !self.closed
            && !self.endpoint_ids.contains(&info.endpoint_id)
            && !info
                .ipv4
                .iter()
                .any(|a| *a != [0; 4] && self.addrs4.contains(a))
            && !info
                .ipv6
                .iter()
                .any(|a| *a != [0; 16] && self.addrs6.contains(a))
    }
}

/// True when the prefix `net`/`len` covers `addr`.
pub(crate) fn covers<const N: usize>(net: &[u8; N], len: u32, addr: &[u8; N]) -> bool {
    let full = (len / 8) as usize;
    if net[..full.min(N)] != addr[..full.min(N)] {
        return false;
    }
    let rest = len % 8;
    rest == 0 || full >= N || (net[full] ^ addr[full]) >> (8 - rest) == 0
}

#[cfg(test)]
mod tests {
    use std::{
        net::IpAddr,
        time::{Duration, Instant},
    };

    use maps_schema::{
        maps::{ENDPOINTS, IDENT4, IDENT6, IPCACHE4, IPCACHE6, POLICY},
        programs::{FROM_ENDPOINT, TO_ENDPOINT},
    };

    use super::*;

    use weir_api::Endpoint;

    use crate::{
        dataplane::{attachments::AttachDriver, endpoints},
        kernel::fake::FakeKernel,
    };

    struct Kernel {
        k: FakeKernel,
        endpoints: crate::kernel::fake::FakeMap<u32, EndpointInfo>,
        ident4: crate::kernel::fake::FakeMap<[u8; 4], IdentityInfo>,
        policy: crate::kernel::fake::FakeMap<PolicyKey, PolicyValue>,
        services: crate::dataplane::services::FakeServiceMaps,
    }

    fn kernel() -> Kernel {
        let k = FakeKernel::default();
        k.tc().current = 7;
        Kernel {
            endpoints: k.map(ENDPOINTS),
            ident4: k.map(IDENT4),
            policy: k.map(POLICY),
            services: crate::dataplane::services::FakeServiceMaps::new(&k),
            k,
        }
    }

    fn plane(kernel: &Kernel) -> Dataplane {
        let k = &kernel.k;
        Dataplane {
            attachments: AttachDriver::new(Box::new(k.clone())),
            endpoints: MapDriver::new(Box::new(kernel.endpoints.clone())),
            endpoints_manager: EndpointsManager::new(),
            ident4: MapDriver::new(Box::new(kernel.ident4.clone())),
            ident6: MapDriver::new(Box::new(k.map::<[u8; 16], IdentityInfo>(IDENT6))),
            ipcache4: MapDriver::new(Box::new(k.map::<Prefix<[u8; 4]>, IdentityInfo>(IPCACHE4))),
            ipcache6: MapDriver::new(Box::new(k.map::<Prefix<[u8; 16]>, IdentityInfo>(IPCACHE6))),
            policy: MapDriver::new(Box::new(kernel.policy.clone())),
            services: kernel.services.drivers(),
        }
    }

    fn policy_contents(kernel: &Kernel) -> Vec<(PolicyKey, PolicyValue)> {
        let mut all = kernel.policy.unordered();
        all.sort_by_key(|(k, _)| k.endpoint_id);
        all
    }

    fn ifname(i: u32) -> String {
        format!("weir{i}")
    }

    fn addr(i: u32) -> [u8; 4] {
        [10, 0, 0, u8::try_from(i).expect("small")]
    }

    fn policy_key(endpoint_id: u32) -> PolicyKey {
        PolicyKey {
            endpoint_id,
            peer_identity: 0,
            port: 80,
            protocol: 6,
            direction: maps_schema::policy::INGRESS,
        }
    }

    /// Endpoint `i` (id `i`) on link `weir{i}` (index 10 + i), with its identity and one policy entry.
    fn add_endpoint(kernel: &Kernel, dp: &mut Dataplane, i: u32) -> EndpointInfo {
        kernel.k.add_link(&ifname(i), 10 + i);
        // The links as the link watcher reports them from this kernel.
        for event in kernel.k.link_events() {
            if let crate::kernel::LinkEvent::Up {
                ifname,
                ifindex,
                up,
            } = event
            {
                dp.attachments.link_up(&ifname, ifindex, up);
                dp.endpoints_manager
                    .link_up(&mut dp.endpoints, &ifname, ifindex);
            }
        }
        let endpoint = Endpoint {
            id: i,
            container_id: format!("c{i}"),
            ifname: "eth0".into(),
            host_ifname: ifname(i),
            netns: String::new(),
            namespace: String::new(),
            pod: String::new(),
            labels: std::collections::BTreeMap::new(),
            handle: String::new(),
            ips: vec![IpAddr::from(addr(i))],
        };
        let info = endpoints::entry(&endpoint, 100 + i, 0);
        dp.endpoints_manager
            .upsert(&mut dp.endpoints, &ifname(i), info);
        dp.ident4.set(
            addr(i),
            IdentityInfo {
                identity: 100 + i,
                ..IdentityInfo::default()
            },
        );
        dp.policy.set(policy_key(i), PolicyValue::default());
        info
    }

    /// Applies until clean (bounded: backoff is at most 5 s per item).
    fn converge(dp: &mut Dataplane) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match dp.apply() {
                Ok(()) => return,
                Err(e) if Instant::now() < deadline => {
                    let wait = e
                        .retry_at()
                        .map_or(Duration::from_millis(5), |t| t - Instant::now().min(t));
                    std::thread::sleep(wait.max(Duration::from_millis(1)));
                }
                Err(e) => panic!("no convergence: {e}"),
            }
        }
    }

    fn attached(k: &FakeKernel, ifindex: u32) -> bool {
        let s = k.tc();
        s.attached.contains(&(ifindex, "Ingress".into(), 7))
            && s.attached.contains(&(ifindex, "Egress".into(), 7))
    }

    #[test]
    fn a_failing_attachment_on_one_link_leaves_the_other_links_programmed() {
        let kernel = kernel();
        let mut dp = plane(&kernel);
        let infos: Vec<EndpointInfo> = (1..=3).map(|i| add_endpoint(&kernel, &mut dp, i)).collect();
        kernel.k.tc().failing.insert(ifname(2));
        let err = dp.apply().expect_err("weir2's attachment fails");
        assert_eq!(err.dirty_drivers(), vec!["attachments"], "{err}");
        assert!(err.to_string().contains("weir2"), "{err}");
        for i in [1, 3] {
            assert!(attached(&kernel.k, 10 + i), "weir{i} runs the programs");
        }
        assert!(!attached(&kernel.k, 12));
        let written: Vec<u32> = kernel
            .endpoints
            .contents()
            .iter()
            .map(|(k, _)| *k)
            .collect();
        assert!(
            written.contains(&11) && written.contains(&13),
            "the other links' endpoints are programmed: {written:?}"
        );
        assert_eq!(policy_contents(&kernel).len(), 3);
        assert!(dp.is_dirty(), "weir2 stays dirty");

        // The link recovers: the retry (after its backoff) attaches it, and nothing else is rewritten.
        let writes = kernel.endpoints.mutations() + kernel.policy.mutations();
        kernel.k.tc().failing.clear();
        converge(&mut dp);
        assert!(attached(&kernel.k, 12));
        assert!(!dp.is_dirty());
        assert_eq!(
            kernel.endpoints.mutations() + kernel.policy.mutations(),
            writes + u64::from(!written.contains(&12)),
            "only what was owed is written"
        );
        let mut want: Vec<(u32, EndpointInfo)> =
            (1..=3).map(|i| (10 + i, infos[i as usize - 1])).collect();
        want.sort_by_key(|(k, _)| *k);
        assert_eq!(kernel.endpoints.contents(), want);
    }

    #[test]
    fn an_endpoint_is_not_opened_before_its_policy_is_written_and_others_proceed() {
        let kernel = kernel();
        let mut dp = plane(&kernel);
        for i in 1..=2 {
            add_endpoint(&kernel, &mut dp, i);
        }
        kernel.policy.fail_next_writes(1);
        let err = dp.apply().expect_err("one policy write fails");
        let with_policy: Vec<u32> = kernel
            .policy
            .unordered()
            .iter()
            .map(|(k, _)| k.endpoint_id)
            .collect();
        assert_eq!(with_policy.len(), 1, "the other policy entry is written");
        let open: Vec<u32> = kernel
            .endpoints
            .contents()
            .iter()
            .map(|(_, v)| v.endpoint_id)
            .collect();
        assert_eq!(
            open, with_policy,
            "only the endpoint whose policy is written is opened ({err})"
        );
        assert!(
            err.pending
                .iter()
                .any(|p| p.driver == ENDPOINTS && p.held == 1),
            "{err}"
        );
        converge(&mut dp);
        assert_eq!(kernel.endpoints.contents().len(), 2);
    }

    #[test]
    fn a_kernel_dropping_every_write_then_recovering_converges_with_no_orphans() {
        let kernel = kernel();
        // An earlier run left orphans in the maps and a link pin of a vanished pod.
        kernel.endpoints.preload(&[(99, EndpointInfo::default())]);
        kernel
            .policy
            .preload(&[(policy_key(99), PolicyValue::default())]);
        kernel
            .ident4
            .preload(&[(addr(99), IdentityInfo::default())]);
        kernel
            .k
            .tc()
            .pins
            .insert(("weirgone".into(), FROM_ENDPOINT.into()), 7);
        let mut dp = plane(&kernel);
        let infos: Vec<EndpointInfo> = (1..=5).map(|i| add_endpoint(&kernel, &mut dp, i)).collect();

        kernel.k.drop_all_writes(true);
        for _ in 0..5 {
            let err = dp.apply().expect_err("every write fails");
            assert!(err.retry_at().is_some(), "failed items wait for a retry");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(
            kernel.endpoints.contents(),
            vec![(99, EndpointInfo::default())],
            "nothing opened while policy cannot be written"
        );
        kernel.k.drop_all_writes(false);
        converge(&mut dp);

        let want: Vec<(u32, EndpointInfo)> =
            (1..=5).map(|i| (10 + i, infos[i as usize - 1])).collect();
        assert_eq!(
            kernel.endpoints.contents(),
            want,
            "exactly the desired endpoints"
        );
        assert_eq!(
            policy_contents(&kernel),
            (1..=5)
                .map(|i| (policy_key(i), PolicyValue::default()))
                .collect::<Vec<_>>()
        );
        assert_eq!(kernel.ident4.contents().len(), 5);
        let pins: Vec<(String, String)> = kernel.k.tc().pins.keys().cloned().collect();
        let mut want_pins: Vec<(String, String)> = (1..=5)
            .flat_map(|i| {
                [
                    (ifname(i), FROM_ENDPOINT.to_owned()),
                    (ifname(i), TO_ENDPOINT.to_owned()),
                ]
            })
            .collect();
        want_pins.sort();
        assert_eq!(pins, want_pins, "the orphan pin is gone");
        for i in 1..=5 {
            assert!(attached(&kernel.k, 10 + i));
        }
        assert!(!dp.is_dirty());
        // Converged: another apply writes nothing.
        let before =
            kernel.endpoints.mutations() + kernel.policy.mutations() + u64::from(kernel.k.tc().ops);
        dp.apply().expect("clean");
        assert_eq!(
            kernel.endpoints.mutations() + kernel.policy.mutations() + u64::from(kernel.k.tc().ops),
            before
        );
    }

    /// A Service `db` (10.96.0.10:80) whose one ready endpoint is endpoint 1's address.
    fn db_service() -> crate::calc::policy::model::PolicySet {
        let docs = format!(
            "kind: Service\nmetadata: {{name: db, namespace: prod}}\nspec: {{clusterIP: 10.96.0.10, ports: [{{name: sql, port: 80, targetPort: 8080}}]}}\n---\nkind: EndpointSlice\nmetadata: {{name: db-1, namespace: prod, labels: {{kubernetes.io/service-name: db}}}}\naddressType: IPv4\nports: [{{name: sql, port: 8080}}]\nendpoints:\n- {{addresses: [{}], conditions: {{ready: true}}}}\n",
            std::net::Ipv4Addr::from(addr(1))
        );
        crate::calc::policy::load::parse_str("s.yaml", &docs).expect("valid")
    }

    #[test]
    fn service_maps_wait_for_policy_and_a_frontend_for_its_backends() {
        let kernel = kernel();
        let mut dp = plane(&kernel);
        add_endpoint(&kernel, &mut dp, 1);
        let set = db_service();
        dp.services.set(&set.services, &set.endpoint_slices);
        kernel.policy.fail_next_writes(1);
        let err = dp.apply().expect_err("the policy write fails");
        assert!(
            kernel.services.frontends.unordered().is_empty()
                && kernel.services.backends.unordered().is_empty(),
            "no service entry before the policy is written ({err})"
        );
        assert!(
            err.pending
                .iter()
                .any(|p| p.driver == maps_schema::service::SVC4 && p.held == 1),
            "{err}"
        );
        converge(&mut dp);
        assert_eq!(kernel.services.frontends.unordered().len(), 1);
        assert_eq!(kernel.services.backends.unordered().len(), 1);

        // A backend that cannot be written holds its frontend; the retry writes both.
        let mut more = db_service();
        let mut svc = more.services.values().next().expect("db").clone();
        svc.name = "db2".into();
        svc.cluster_ips = vec![std::net::IpAddr::from([10, 96, 0, 11])];
        more.services.insert(("prod".into(), "db2".into()), svc);
        let mut slice = more.endpoint_slices.values().next().expect("slice").clone();
        slice.name = "db2-1".into();
        slice.service = "db2".into();
        slice.endpoints[0].addresses = vec![std::net::IpAddr::from([10, 0, 0, 9])];
        more.endpoint_slices
            .insert(("prod".into(), "db2-1".into()), slice);
        dp.services.set(&more.services, &more.endpoint_slices);
        kernel.services.backends.fail_next_writes(1);
        let err = dp.apply().expect_err("the backend write fails");
        assert_eq!(
            kernel.services.frontends.unordered().len(),
            1,
            "the new frontend waits for its backend ({err})"
        );
        converge(&mut dp);
        assert_eq!(kernel.services.frontends.unordered().len(), 2);
        assert_eq!(kernel.services.backends.unordered().len(), 2);
    }

    fn repairs(dp: &Dataplane) -> std::collections::BTreeMap<String, u64> {
        dp.stats()
            .repairs
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    #[test]
    fn a_refresh_finds_what_was_changed_from_outside_repairs_and_counts_it_by_driver() {
        let kernel = kernel();
        let mut dp = plane(&kernel);
        let infos: Vec<EndpointInfo> = (1..=3).map(|i| add_endpoint(&kernel, &mut dp, i)).collect();
        converge(&mut dp);
        let policy = policy_contents(&kernel);
        let idents = kernel.ident4.contents();
        assert!(
            repairs(&dp).is_empty(),
            "the first converge repairs nothing"
        );

        // Nothing changed: a refresh reads back and writes nothing.
        let before = kernel.endpoints.mutations()
            + kernel.policy.mutations()
            + kernel.ident4.mutations()
            + u64::from(kernel.k.tc().ops);
        dp.refresh();
        converge(&mut dp);
        assert_eq!(
            kernel.endpoints.mutations()
                + kernel.policy.mutations()
                + kernel.ident4.mutations()
                + u64::from(kernel.k.tc().ops),
            before
        );
        assert!(repairs(&dp).is_empty());

        // An operator's stray commands: a policy entry deleted, an identity altered, an endpoint
        // entry deleted, an extra policy entry, weir2's ingress program detached, a map's pin removed.
        kernel.policy.tamper(policy_key(1), None);
        kernel
            .policy
            .tamper(policy_key(77), Some(PolicyValue::default()));
        kernel.ident4.tamper(
            addr(2),
            Some(IdentityInfo {
                identity: 9999,
                ..IdentityInfo::default()
            }),
        );
        kernel.endpoints.tamper(13, None);
        kernel.k.tc().attached.remove(&(12, "Ingress".into(), 7));
        kernel.policy.unpin();
        // Before the refresh, nothing is dirty: the drift is unknown to the driver.
        assert!(!dp.is_dirty());
        dp.refresh();
        converge(&mut dp);

        assert_eq!(
            policy_contents(&kernel),
            policy,
            "policy restored, the extra entry gone"
        );
        assert_eq!(kernel.ident4.contents(), idents, "identity restored");
        let want: Vec<(u32, EndpointInfo)> =
            (1..=3).map(|i| (10 + i, infos[i as usize - 1])).collect();
        assert_eq!(kernel.endpoints.contents(), want, "endpoint entry restored");
        assert!(attached(&kernel.k, 12), "weir2's program is attached again");
        assert!(kernel.policy.is_pinned(), "the policy map is pinned again");
        let want: std::collections::BTreeMap<String, u64> = [
            ("tc-attachments", 1),
            (ENDPOINTS, 1),
            (IDENT4, 1),
            // Missing, extra, and the pin.
            (POLICY, 3),
        ]
        .into_iter()
        .map(|(d, n)| (d.to_owned(), n))
        .collect();
        assert_eq!(repairs(&dp), want);
    }

    #[test]
    fn a_kernel_event_repairs_the_one_link_at_once_and_a_new_link_is_no_repair() {
        let kernel = kernel();
        let mut dp = plane(&kernel);
        for i in 1..=2 {
            add_endpoint(&kernel, &mut dp, i);
        }
        converge(&mut dp);
        // The qdisc of weir1 deleted: both of its programs gone; the kernel names its ifindex.
        {
            let mut tc = kernel.k.tc();
            tc.attached.retain(|(ifindex, _, _)| *ifindex != 11);
        }
        dp.attachments.check(11);
        assert!(dp.is_dirty(), "the event makes the link dirty");
        converge(&mut dp);
        assert!(attached(&kernel.k, 11));
        assert_eq!(repairs(&dp).get("tc-attachments"), Some(&2));
        // An event for a link that is not a workload link changes nothing.
        dp.attachments.check(999);
        assert!(!dp.is_dirty());
        // A new pod's link is attached, not repaired.
        add_endpoint(&kernel, &mut dp, 3);
        converge(&mut dp);
        assert!(attached(&kernel.k, 13));
        assert_eq!(repairs(&dp).get("tc-attachments"), Some(&2));
    }
}
