//! An agent in the test's own process (feature `testing`): the real API router, IPAM service
//! (embedded datastore in a temporary directory), node and apply loop, over the fake kernel
//! (`kernel::fake::FakeKernel`) — so clients such as weir-cni are tested against the
//! API as the agent serves it, not a hand-written imitation. Test code only.
//!
//! Kept to wiring: the parts are the daemon's own; only the kernel is fake, and the link watcher
//! is the test ([`TestAgent::link_created`]).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
    thread::JoinHandle,
    time::Duration,
};

use maps_schema::maps::{ENDPOINTS, IDENT4, IDENT6, IPCACHE4, IPCACHE6, POLICY};

use crate::{
    api::server::{self, Api},
    calc::ipam_service::IpamService,
    control::{
        applier::{self, Command, LoopError, LoopHandle},
        node::Node,
    },
    dataplane::{
        attachments::AttachDriver, endpoints::EndpointsManager, map_driver::MapDriver,
        plane::Dataplane,
    },
    kernel::{LinkEvent, fake::FakeKernel},
    paths::Paths,
};

/// The pools of a test agent: small, so a test can exhaust them.
pub const POOLS: [&str; 2] = ["10.77.0.0/28", "fd00:77::/124"];
/// The node name of a test agent.
pub const NODE: &str = "test-node";

/// Errors starting a test agent.
#[derive(Debug, thiserror::Error)]
pub enum TestAgentError {
    /// The temporary directory.
    #[error("cannot create the test agent's directory: {0}")]
    Dir(#[source] std::io::Error),
    /// The node.
    #[error(transparent)]
    Node(#[from] crate::control::node::NodeError),
    /// IPAM.
    #[error(transparent)]
    Ipam(#[from] crate::calc::ipam_service::IpamServiceError),
    /// The apply thread.
    #[error("cannot start the apply thread: {0}")]
    Thread(#[source] std::io::Error),
    /// The first apply.
    #[error("the test agent did not get ready: {0}")]
    NotReady(String),
}

/// A running in-process agent; stops its apply thread when dropped.
pub struct TestAgent {
    kernel: FakeKernel,
    dir: tempfile::TempDir,
    socket: PathBuf,
    dataplane: LoopHandle,
    applier: Option<JoinHandle<()>>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl std::fmt::Debug for TestAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestAgent")
            .field("socket", &self.socket)
            .finish_non_exhaustive()
    }
}

impl TestAgent {
    /// Starts an agent serving on a socket in a fresh temporary directory, ready (its first
    /// apply done) when this returns. Call from inside a tokio runtime.
    pub async fn start() -> Result<Self, TestAgentError> {
        let dir = tempfile::tempdir().map_err(TestAgentError::Dir)?;
        let paths = Paths {
            bpf_root: dir.path().join("bpf"),
            api_socket: dir.path().join("weir.sock"),
            state_dir: dir.path().join("state"),
            policy_dir: dir.path().join("policies"),
            cni_conf_dir: dir.path().join("net.d"),
            proc_sys_net: dir.path().join("proc-sys-net"),
        };
        std::fs::create_dir_all(&paths.state_dir).map_err(TestAgentError::Dir)?;
        let kernel = FakeKernel::default();
        let node = Node::open(
            &paths,
            fake_dataplane(&kernel),
            Default::default(),
            Vec::new(),
        )?;
        let (dataplane, applier) = applier::spawn(node).map_err(|e| match e {
            LoopError::Spawn(e) => TestAgentError::Thread(e),
            other => TestAgentError::NotReady(other.to_string()),
        })?;
        let pools: Vec<String> = POOLS.iter().map(|&p| p.to_owned()).collect();
        let ipam = IpamService::open(
            &format!("embedded:{}", paths.state_dir.join("ipam.redb").display()),
            NODE,
            BTreeMap::new(),
            &pools,
            (30, 126),
            Duration::from_secs(600),
            &paths.state_dir,
        )
        .await?;
        let api = Arc::new(Api {
            dataplane: dataplane.clone(),
            ipam: Arc::new(ipam),
            node: NODE.to_owned(),
            paths: paths.clone(),
            ct: Arc::default(),
            ct_ops: Arc::default(),
            ct_layout: maps_schema::conntrack::LAYOUT,
            tc_attach: attach::Mechanism::Filter,
            kernel: Arc::new(kernel.clone()),
            monitor: crate::observe::monitor::Monitor::default(),
            pod_wait: None,
            socket_lb: None,
            socket_lb_scope: None,
            nat: std::sync::Arc::default(),
        });
        let socket = paths.api_socket.clone();
        let server = {
            let socket = socket.clone();
            tokio::spawn(async move { server::serve(&socket, api).await })
        };
        let agent = Self {
            kernel,
            dir,
            socket,
            dataplane,
            applier: Some(applier),
            server,
        };
        // The link dump over the fake kernel (no links yet): the first apply makes it ready.
        for event in agent.kernel.link_events() {
            agent.event(event);
        }
        let mut snapshots = agent.dataplane.subscribe();
        match tokio::time::timeout(
            Duration::from_secs(20),
            snapshots.wait_for(|s| s.applied.ready),
        )
        .await
        {
            Ok(Ok(_)) => {}
            _ => {
                let applied = agent.dataplane.snapshot().applied.clone();
                return Err(TestAgentError::NotReady(format!(
                    "not ready within 20 s: {applied:?}"
                )));
            }
        }
        agent.wait_for_socket().await?;
        Ok(agent)
    }

    /// The API socket.
    #[must_use]
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The agent's pin root (what it names in its answers).
    #[must_use]
    pub fn bpf_root(&self) -> PathBuf {
        self.dir.path().join("bpf")
    }

    /// weir-cni created a workload veth (still down, as weir-cni leaves it until its programs
    /// are attached): the fake kernel has the link, and the link watcher reports it.
    pub fn link_created(&self, ifname: &str, ifindex: u32) {
        self.kernel.add_link(ifname, ifindex);
        self.event(LinkEvent::Up {
            ifname: ifname.to_owned(),
            ifindex,
            up: false,
        });
    }

    fn event(&self, event: LinkEvent) {
        if self.dataplane.send(Command::Link(event)).is_err() {
            tracing::error!("the test agent's dataplane loop has stopped");
        }
    }

    async fn wait_for_socket(&self) -> Result<(), TestAgentError> {
        for _ in 0..200 {
            if tokio::net::UnixStream::connect(&self.socket).await.is_ok() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Err(TestAgentError::NotReady(format!(
            "nothing listens on {} after 2 s",
            self.socket.display()
        )))
    }
}

impl Drop for TestAgent {
    fn drop(&mut self) {
        self.server.abort();
        self.dataplane.stop();
        if let Some(applier) = self.applier.take()
            && applier.join().is_err()
        {
            tracing::error!("the test agent's apply thread panicked");
        }
    }
}

/// Every driver over the one fake kernel.
fn fake_dataplane(kernel: &FakeKernel) -> Dataplane {
    Dataplane {
        attachments: AttachDriver::new(Box::new(kernel.clone())),
        endpoints: MapDriver::new(Box::new(kernel.map(ENDPOINTS))),
        endpoints_manager: EndpointsManager::new(),
        ident4: MapDriver::new(Box::new(kernel.map(IDENT4))),
        ident6: MapDriver::new(Box::new(kernel.map(IDENT6))),
        ipcache4: MapDriver::new(Box::new(kernel.map(IPCACHE4))),
        ipcache6: MapDriver::new(Box::new(kernel.map(IPCACHE6))),
        policy: MapDriver::new(Box::new(kernel.map(POLICY))),
        services: crate::dataplane::services::ServiceMaps::fake(kernel),
    }
}
