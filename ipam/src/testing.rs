//! Test support: a real etcd on loopback, started from Debian's `etcd` binary.

use std::{
    net::TcpListener,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

/// Why an etcd could not be started.
#[derive(Debug, thiserror::Error)]
pub enum EtcdStartError {
    /// The binary is missing.
    #[error("cannot run {binary}: install the etcd-server package (`cargo xtask setup` does)")]
    Spawn {
        /// The binary tried.
        binary: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// Ports or the data directory could not be had.
    #[error("cannot prepare etcd: {0}")]
    Prepare(#[source] std::io::Error),
    /// It started but never answered.
    #[error("etcd on {url} did not answer within {secs}s")]
    NotReady {
        /// The client URL.
        url: String,
        /// How long we waited.
        secs: u64,
    },
}

/// An etcd server on free loopback ports with a temporary data directory, killed on drop.
#[derive(Debug)]
pub struct EtcdServer {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl EtcdServer {
    /// Starts `etcd` (or `$WEIR_ETCD_BIN`) and waits until it accepts connections.
    pub fn start() -> Result<Self, EtcdStartError> {
        let binary = std::env::var("WEIR_ETCD_BIN").unwrap_or_else(|_| "etcd".into());
        let dir = tempfile::tempdir().map_err(EtcdStartError::Prepare)?;
        let (cp, pp) = (
            free_port().map_err(EtcdStartError::Prepare)?,
            free_port().map_err(EtcdStartError::Prepare)?,
        );
        let url = format!("http://127.0.0.1:{cp}");
        let peer = format!("http://127.0.0.1:{pp}");
        let data: PathBuf = dir.path().join("data");
        let child = Command::new(&binary)
            .arg("--name=wt")
            .arg(format!("--data-dir={}", data.display()))
            .arg(format!("--listen-client-urls={url}"))
            .arg(format!("--advertise-client-urls={url}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=wt={peer}"))
            .arg("--log-level=error")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|source| EtcdStartError::Spawn { binary, source })?;
        let mut me = Self {
            child,
            url,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect(("127.0.0.1", cp)).is_ok() {
                return Ok(me);
            }
            if let Ok(Some(_)) = me.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(EtcdStartError::NotReady {
            url: me.url.clone(),
            secs: 20,
        })
    }

    /// Starts etcd, or returns `None` (printing why) when it cannot start and `CI` is not set. Under `CI`
    /// a failure to start panics: tests that need etcd must not skip silently there.
    pub fn start_or_skip() -> Option<Self> {
        match Self::start() {
            Ok(s) => Some(s),
            Err(e) if std::env::var_os("CI").is_none() => {
                eprintln!("skipping test - {e}");
                None
            }
            Err(e) => panic!("CI is set and etcd is required: {e}"),
        }
    }

    /// The client URL.
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Wraps any store and injects faults into its transactions: a conflict (a racing writer won), a crash
/// before the write, or a crash after it (the write happened, the caller never heard).
#[derive(Clone, Debug)]
pub struct Faulty<S> {
    inner: S,
    plan: std::sync::Arc<std::sync::Mutex<(crate::store::memory::Faults, u64)>>,
}

impl<S> Faulty<S> {
    /// Wraps `inner` with no faults.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            plan: std::sync::Arc::default(),
        }
    }

    /// Sets the faults and the seed they are drawn from.
    pub fn set_faults(&self, faults: crate::store::memory::Faults, seed: u64) {
        if let Ok(mut p) = self.plan.lock() {
            *p = (faults, seed | 1);
        }
    }

    fn roll(&self) -> (bool, bool, bool) {
        let Ok(mut p) = self.plan.lock() else {
            return (false, false, false);
        };
        let f = p.0;
        let mut state = p.1;
        let mut draw = |per_mille: u32| {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            per_mille > 0 && state.wrapping_mul(0x2545_f491_4f6c_dd1d) % 1000 < u64::from(per_mille)
        };
        let drawn = (
            draw(f.conflict_per_mille),
            draw(f.fail_before_per_mille),
            draw(f.fail_after_per_mille),
        );
        p.1 = state;
        drawn
    }
}

impl<S: crate::store::Store> crate::store::Store for Faulty<S> {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    fn atomic_txn_limit(&self) -> Option<usize> {
        self.inner.atomic_txn_limit()
    }

    async fn get(
        &self,
        key: &crate::store::Key,
    ) -> Result<Option<crate::store::Versioned>, crate::store::StoreError> {
        self.inner.get(key).await
    }

    async fn list(
        &self,
        kind: crate::store::Kind,
        prefix: &str,
    ) -> Result<Vec<(String, crate::store::Versioned)>, crate::store::StoreError> {
        self.inner.list(kind, prefix).await
    }

    async fn txn(&self, ops: Vec<crate::store::Op>) -> Result<(), crate::store::StoreError> {
        let (conflict, before, after) = self.roll();
        if conflict {
            let key = ops.first().map(|o| o.key().to_string()).unwrap_or_default();
            return Err(crate::store::StoreError::Conflict { key });
        }
        if before {
            return Err(crate::store::StoreError::Injected {
                what: "crash before write",
            });
        }
        self.inner.txn(ops).await?;
        if after {
            return Err(crate::store::StoreError::Injected {
                what: "crash after write",
            });
        }
        Ok(())
    }
}
