//! TCP inside pods' network namespaces, reached through a process of the pod (the sandbox's
//! pause): a listener that accepts until dropped, and bounded connection probes. Sockets keep the
//! namespace they were created in, so only their creation runs on a thread that entered it.

use std::{
    fs::File,
    net::{SocketAddr, TcpListener, TcpStream},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use nix::sched::{CloneFlags, setns};

/// A pod's network namespace, held open by its file.
#[derive(Debug)]
pub struct PodNet {
    file: File,
}

impl PodNet {
    /// The network namespace of process `pid`.
    #[must_use]
    pub fn of_process(pid: u32) -> Self {
        let path = format!("/proc/{pid}/ns/net");
        Self {
            file: File::open(&path).unwrap_or_else(|e| panic!("cannot open {path}: {e}")),
        }
    }

    /// Runs `f` on a thread inside the namespace and returns its value.
    pub fn run<T: Send, F: FnOnce() -> T + Send>(&self, f: F) -> T {
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    setns(&self.file, CloneFlags::CLONE_NEWNET)
                        .unwrap_or_else(|e| panic!("setns into a pod: {e}"));
                    f()
                })
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    /// Whether a TCP connection from inside the pod to `to` completes within `bound`, for each
    /// target in order (one thread, one namespace switch).
    #[must_use]
    pub fn connects(&self, to: &[SocketAddr], bound: Duration) -> Vec<bool> {
        self.run(|| {
            to.iter()
                .map(|addr| TcpStream::connect_timeout(addr, bound).is_ok())
                .collect()
        })
    }
}

/// A TCP listener inside a pod that accepts (and closes) connections until dropped.
#[derive(Debug)]
pub struct PodListener {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl PodListener {
    /// Listens on `0.0.0.0:port` inside `pod`.
    #[must_use]
    pub fn start(pod: &PodNet, port: u16) -> Self {
        let listener = pod
            .run(move || TcpListener::bind(("0.0.0.0", port)))
            .unwrap_or_else(|e| panic!("listen on port {port} in a pod: {e}"));
        listener.set_nonblocking(true).expect("nonblocking");
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => drop(conn),
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for PodListener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
