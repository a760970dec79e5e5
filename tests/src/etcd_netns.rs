//! A real etcd inside a test's infra network namespace (nodes reach it over veths), killed on drop. Its
//! client port is 2379 inside that namespace only, so tests never collide.

use std::{
    future::Future,
    net::TcpStream,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use ipam::store::etcd::EtcdStore;

use crate::netns::NetNs;

/// The client port inside the namespace.
pub const PORT: u16 = 2379;

/// Runs `f` with a client of the etcd in `infra`, from inside that namespace on a runtime of its own.
pub fn with_store<T, F, Fut>(infra: &NetNs, f: F) -> T
where
    T: Send,
    F: FnOnce(EtcdStore) -> Fut + Send,
    Fut: Future<Output = T>,
{
    infra.run(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let store = EtcdStore::connect(&[format!("http://127.0.0.1:{PORT}")])
                .await
                .expect("connect to etcd");
            f(store).await
        })
    })
}

/// etcd running in a namespace.
#[derive(Debug)]
pub struct NetnsEtcd {
    child: Child,
    _dir: tempfile::TempDir,
}

impl NetnsEtcd {
    /// Starts `etcd` (or `$WEIR_ETCD_BIN`) in `ns`, listening on every address of it, and waits (20 s at most)
    /// until it accepts connections.
    #[must_use]
    pub fn start(ns: &NetNs) -> Self {
        let binary = std::env::var("WEIR_ETCD_BIN").unwrap_or_else(|_| "etcd".into());
        let dir = tempfile::tempdir().expect("etcd data dir");
        let data = dir.path().join("data");
        let peer = "http://127.0.0.1:2380";
        let child = Command::new("ip")
            .args(["netns", "exec", ns.name(), &binary])
            .arg("--name=wt")
            .arg(format!("--data-dir={}", data.display()))
            .arg(format!("--listen-client-urls=http://0.0.0.0:{PORT}"))
            .arg(format!("--advertise-client-urls=http://127.0.0.1:{PORT}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=wt={peer}"))
            .arg("--log-level=error")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("start {binary} (install etcd-server: cargo xtask setup): {e}")
            });
        let mut me = Self { child, _dir: dir };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if ns.run(|| TcpStream::connect(("127.0.0.1", PORT)).is_ok()) {
                return me;
            }
            if let Ok(Some(status)) = me.child.try_wait() {
                panic!("etcd exited at start: {status}");
            }
            assert!(
                Instant::now() < deadline,
                "etcd did not accept connections within 20 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for NetnsEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
