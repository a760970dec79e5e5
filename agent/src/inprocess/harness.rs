//! The in-process tier's kernel: the one fake kernel (`kernel::fake`: its links, attachments
//! and link watch) and the six maps the drivers hold over it, whose write logs the tests count;
//! and the expected kernel state computed independently of the loop, by a fresh full compile of
//! the sources on disk.

use std::{
    collections::{BTreeMap, BTreeSet, HashSet},
    path::Path,
    time::Duration,
};

use maps_schema::{EndpointInfo, IdentityInfo, PolicyKey, PolicyValue};

use crate::{
    calc::reference,
    control::node::Node,
    dataplane::{
        attachments::AttachDriver, endpoints::EndpointsManager, map_driver::MapDriver,
        plane::Dataplane,
    },
    kernel::{
        Prefix,
        fake::{self, FakeMap},
    },
    paths::Paths,
};

pub(crate) use crate::calc::reference::{AnyKey, State, policy_key};

/// Where every fake map's write log stood.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mark([usize; 6]);

/// The fake kernel (links, attachments, link watch) and the six maps of the endpoint drivers,
/// made by it (they share its faults). Clones share everything.
#[derive(Clone)]
pub(crate) struct FakeKernel {
    /// The one fake kernel: its link table is the node's links, its `LinkIo` the link watch.
    pub(crate) fake: fake::FakeKernel,
    pub(crate) endpoints: FakeMap<u32, EndpointInfo>,
    pub(crate) ident4: FakeMap<[u8; 4], IdentityInfo>,
    pub(crate) ident6: FakeMap<[u8; 16], IdentityInfo>,
    pub(crate) ipcache4: FakeMap<Prefix<[u8; 4]>, IdentityInfo>,
    pub(crate) ipcache6: FakeMap<Prefix<[u8; 16]>, IdentityInfo>,
    pub(crate) policy: FakeMap<PolicyKey, PolicyValue>,
    /// The service maps (not in [`Mark`]: their tests count them on their own).
    pub(crate) services: crate::dataplane::services::FakeServiceMaps,
}

impl FakeKernel {
    pub(crate) fn new() -> Self {
        use maps_schema::maps::{ENDPOINTS, IDENT4, IDENT6, IPCACHE4, IPCACHE6, POLICY};
        let fake = fake::FakeKernel::default();
        Self {
            endpoints: fake.map(ENDPOINTS),
            ident4: fake.map(IDENT4),
            ident6: fake.map(IDENT6),
            ipcache4: fake.map(IPCACHE4),
            ipcache6: fake.map(IPCACHE6),
            policy: fake.map(POLICY),
            services: crate::dataplane::services::FakeServiceMaps::new(&fake),
            fake,
        }
    }

    /// Fresh drivers over this kernel (what a new agent process has).
    pub(crate) fn dataplane(&self) -> Dataplane {
        Dataplane {
            attachments: AttachDriver::new(Box::new(self.fake.clone())),
            endpoints: MapDriver::new(Box::new(self.endpoints.clone())),
            endpoints_manager: EndpointsManager::new(),
            ident4: MapDriver::new(Box::new(self.ident4.clone())),
            ident6: MapDriver::new(Box::new(self.ident6.clone())),
            ipcache4: MapDriver::new(Box::new(self.ipcache4.clone())),
            ipcache6: MapDriver::new(Box::new(self.ipcache6.clone())),
            policy: MapDriver::new(Box::new(self.policy.clone())),
            services: self.services.drivers(),
        }
    }

    /// Every map write slows down by `delay`.
    pub(crate) fn set_delay(&self, delay: Duration) {
        self.endpoints.set_delay(delay);
        self.ident4.set_delay(delay);
        self.ident6.set_delay(delay);
        self.ipcache4.set_delay(delay);
        self.ipcache6.set_delay(delay);
        self.policy.set_delay(delay);
    }

    pub(crate) fn state(&self) -> State {
        State {
            endpoints: self.endpoints.unordered().into_iter().collect(),
            ident4: self.ident4.unordered().into_iter().collect(),
            ident6: self.ident6.unordered().into_iter().collect(),
            ipcache4: self.ipcache4.unordered().into_iter().collect(),
            ipcache6: self.ipcache6.unordered().into_iter().collect(),
            policy: self.policy.unordered().into_iter().collect(),
        }
    }

    /// Map entries written or deleted so far.
    pub(crate) fn map_writes(&self) -> usize {
        self.mark().0.iter().sum()
    }

    pub(crate) fn mark(&self) -> Mark {
        Mark([
            self.endpoints.touched(),
            self.ident4.touched(),
            self.ident6.touched(),
            self.ipcache4.touched(),
            self.ipcache6.touched(),
            self.policy.touched(),
        ])
    }

    /// Every key written or deleted since `mark`, once per write (duplicates kept).
    pub(crate) fn touched_since(&self, mark: Mark) -> Vec<AnyKey> {
        let m = mark.0;
        let mut out: Vec<AnyKey> = Vec::new();
        out.extend(
            self.endpoints
                .touched_since(m[0])
                .iter()
                .map(|k| AnyKey::Endpoint(*k)),
        );
        out.extend(
            self.ident4
                .touched_since(m[1])
                .iter()
                .map(|k| AnyKey::Ident4(*k)),
        );
        out.extend(
            self.ident6
                .touched_since(m[2])
                .iter()
                .map(|k| AnyKey::Ident6(*k)),
        );
        out.extend(
            self.ipcache4
                .touched_since(m[3])
                .iter()
                .map(|k| AnyKey::Ipcache4(k.len, k.data)),
        );
        out.extend(
            self.ipcache6
                .touched_since(m[4])
                .iter()
                .map(|k| AnyKey::Ipcache6(k.len, k.data)),
        );
        out.extend(self.policy.touched_since(m[5]).iter().map(policy_key));
        out
    }
}

/// The kernel state the sources on disk call for, by a fresh full compile.
pub(crate) fn expected(paths: &Paths, links: &BTreeMap<String, u32>) -> State {
    reference::compile(paths, links).expect("the reference compile")
}

/// Paths of a node under `dir`.
pub(crate) fn paths(dir: &Path) -> Paths {
    Paths {
        state_dir: dir.join("state"),
        policy_dir: dir.join("policies"),
        api_socket: dir.join("weir.sock"),
        cni_conf_dir: dir.join("net.d"),
        ..Paths::with_bpf_root(dir.join("bpf"))
    }
}

/// Opens the node over `kernel` as the daemon does (policies read from the directory).
pub(crate) fn open_node(paths: &Paths, kernel: &FakeKernel) -> Node {
    let (set, errors) = crate::calc::policy::load::load_dir(&paths.policy_dir);
    Node::open(paths, kernel.dataplane(), set, errors).expect("the node opens")
}

/// Keys written, as a set, with a check that none was written twice.
pub(crate) fn once_each(keys: Vec<AnyKey>) -> BTreeSet<AnyKey> {
    let n = keys.len();
    let set: HashSet<AnyKey> = keys.into_iter().collect();
    assert_eq!(set.len(), n, "a key was written more than once");
    set.into_iter().collect()
}

/// The API as the daemon builds it, over the loop `dataplane` and the fake kernel, with an embedded
/// IPAM in `dir` for node `wt-node`; `pod_wait` is a cluster source's wait for the pods requests
/// name (`None`: standalone).
pub(crate) async fn api(
    dir: &Path,
    paths: &Paths,
    kernel: &FakeKernel,
    dataplane: crate::control::applier::LoopHandle,
    pod_wait: Option<Duration>,
) -> crate::api::server::Api {
    let ipam = crate::calc::ipam_service::IpamService::open(
        &format!("embedded:{}", dir.join("ipam.redb").display()),
        "wt-node",
        BTreeMap::new(),
        &[],
        (26, 122),
        Duration::from_secs(600),
        &paths.state_dir,
    )
    .await
    .expect("ipam");
    crate::api::server::Api {
        dataplane,
        ipam: std::sync::Arc::new(ipam),
        node: "wt-node".into(),
        paths: paths.clone(),
        ct: std::sync::Arc::default(),
        ct_ops: std::sync::Arc::default(),
        ct_layout: maps_schema::conntrack::LAYOUT,
        tc_attach: attach::Mechanism::default(),
        kernel: std::sync::Arc::new(kernel.fake.clone()),
        monitor: crate::observe::monitor::Monitor::default(),
        pod_wait,
        socket_lb: None,
        socket_lb_scope: None,
        nat: std::sync::Arc::default(),
    }
}
