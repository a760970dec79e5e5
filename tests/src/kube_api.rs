//! A minimal Kubernetes API server for the tests: plain HTTP/1.1 on 127.0.0.1 or a given address (optionally bound
//! inside a test namespace, where the agent's loopback is), speaking the wire protocol kube-rs's
//! watcher uses for Pods, Namespaces, NetworkPolicies, Nodes, Services and EndpointSlices:
//!
//! - `GET /api/v1/pods?limit=N&continue=T` (and the other kinds' collection paths): a JSON list
//!   with `metadata.resourceVersion` and a `continue` token while pages remain (a page set is a
//!   snapshot taken at its first page, as the real server's);
//! - `GET …?watch=true&resourceVersion=RV&allowWatchBookmarks=true&timeoutSeconds=S`: a chunked
//!   stream of `{"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR, "object": …}` lines, first every
//!   event after RV, then new ones as they happen, a BOOKMARK every [`KubeApi::BOOKMARK_EVERY`],
//!   closed after S seconds; an RV older than the compaction point is an ERROR event with a
//!   Status of code 410 (Gone), as etcd compaction makes it;
//! - `GET /version`.
//!
//! Faults on demand: every request answered 503 ([`Fault::Unavailable`]), connections accepted
//! and dropped unanswered ([`Fault::Drop`]), the listener closed (connection refused) and reopened
//! on the same port ([`KubeApi::stop`], [`KubeApi::start_again`]), every open watch sent a 410
//! ([`KubeApi::expire_watches`]), and lists of a kind held back ([`KubeApi::hold_lists`]).

use std::{
    collections::{BTreeMap, HashMap},
    io::{BufRead as _, BufReader, Write as _},
    net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    sync::{
        Arc, Condvar, Mutex, MutexGuard,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use serde_json::{Value, json};

use crate::netns::NetNs;

/// The kinds served, by collection path.
pub const KINDS: [(&str, &str, &str); 6] = [
    ("/api/v1/pods", "Pod", "v1"),
    ("/api/v1/namespaces", "Namespace", "v1"),
    (
        "/apis/networking.k8s.io/v1/networkpolicies",
        "NetworkPolicy",
        "networking.k8s.io/v1",
    ),
    ("/api/v1/nodes", "Node", "v1"),
    ("/api/v1/services", "Service", "v1"),
    (
        "/apis/discovery.k8s.io/v1/endpointslices",
        "EndpointSlice",
        "discovery.k8s.io/v1",
    ),
];

/// A fault every request meets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Answer normally.
    None,
    /// Answer 503 with a Status (an overloaded or restarting API server).
    Unavailable,
    /// Accept the connection and close it unanswered.
    Drop,
}

#[derive(Default)]
struct KindState {
    /// (namespace, name) → object (with its resourceVersion).
    objects: BTreeMap<(String, String), Value>,
    /// (resourceVersion, type, object), in order.
    log: Vec<(u64, &'static str, Value)>,
    lists: usize,
    watches: usize,
    held: bool,
}

struct State {
    rv: u64,
    /// Watches from an older resourceVersion get 410.
    compacted: u64,
    kinds: HashMap<&'static str, KindState>,
    /// Continue token → (resourceVersion, remaining items).
    pages: HashMap<u64, (u64, Vec<Value>)>,
    next_token: u64,
    fault: Fault,
    /// Bumped to end every open watch; `expired` says with a 410 first.
    epoch: u64,
    expired: bool,
    /// Wall-clock time (UNIX, ns) at which each event was written to a watch stream, by
    /// (kind, resourceVersion): the benchmark's start of "event → kernel".
    sent_at: HashMap<(&'static str, u64), u128>,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The running server; stopped on drop.
pub struct KubeApi {
    shared: Arc<Shared>,
    addr: SocketAddr,
    netns: Option<String>,
    running: Arc<AtomicBool>,
    accept: Option<thread::JoinHandle<()>>,
    _dir: tempfile::TempDir,
    kubeconfig: PathBuf,
}

impl KubeApi {
    /// How often an open watch gets a BOOKMARK.
    pub const BOOKMARK_EVERY: Duration = Duration::from_secs(1);

    /// Starts on 127.0.0.1 (inside `netns` when given: the agent's loopback) on a free port.
    #[must_use]
    pub fn start(netns: Option<&NetNs>) -> Self {
        Self::start_at(netns, IpAddr::V4(Ipv4Addr::LOCALHOST))
    }

    /// Starts on `ip` (an address of `netns` when given, e.g. an infra namespace's bridge address that
    /// several node namespaces reach) on a free port.
    #[must_use]
    pub fn start_at(netns: Option<&NetNs>, ip: IpAddr) -> Self {
        let listener = try_bind(netns.map(NetNs::name), ip, 0).expect("listen");
        let addr = listener.local_addr().expect("local address");
        let dir = tempfile::Builder::new()
            .prefix("wt-kube")
            .tempdir()
            .expect("temp dir");
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, kubeconfig_text(addr)).expect("write the kubeconfig");
        let kinds = KINDS
            .iter()
            .map(|(_, kind, _)| (*kind, KindState::default()))
            .collect();
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                rv: 1,
                compacted: 0,
                kinds,
                pages: HashMap::new(),
                next_token: 1,
                fault: Fault::None,
                epoch: 0,
                expired: false,
                sent_at: HashMap::new(),
            }),
            changed: Condvar::new(),
        });
        let mut api = Self {
            shared,
            addr,
            netns: netns.map(|n| n.name().to_owned()),
            running: Arc::new(AtomicBool::new(false)),
            accept: None,
            _dir: dir,
            kubeconfig,
        };
        api.serve(listener);
        api
    }

    fn serve(&mut self, listener: TcpListener) {
        listener.set_nonblocking(true).expect("nonblocking");
        self.running.store(true, Ordering::SeqCst);
        let (shared, running) = (Arc::clone(&self.shared), Arc::clone(&self.running));
        self.accept = Some(thread::spawn(move || {
            while running.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let shared = Arc::clone(&shared);
                        let running = Arc::clone(&running);
                        thread::spawn(move || {
                            // A client that went away is no failure of the server.
                            let _ = handle(&shared, &running, stream);
                        });
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        thread::sleep(Duration::from_millis(10));
                    }
                    Err(_) => thread::sleep(Duration::from_millis(10)),
                }
            }
        }));
    }

    /// The kubeconfig pointing at this server (no credentials: plain HTTP on loopback).
    #[must_use]
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The server's address.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Closes the listener and every connection: the API server is down (connection refused).
    pub fn stop(&mut self) {
        self.running.store(false, Ordering::SeqCst);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        self.end_watches(false);
    }

    /// Listens again on the same port.
    pub fn start_again(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let listener = loop {
            match try_bind(self.netns.as_deref(), self.addr.ip(), self.addr.port()) {
                Ok(l) => break l,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    thread::sleep(Duration::from_millis(50));
                }
                Err(e) => panic!("cannot listen on {} again: {e}", self.addr),
            }
        };
        self.serve(listener);
    }

    /// Sets the fault every request meets from now on.
    pub fn set_fault(&self, fault: Fault) {
        self.shared.lock().fault = fault;
        if fault == Fault::Drop {
            self.end_watches(false);
        }
    }

    /// Sends every open watch an ERROR event with a 410 Status and compacts history: a watch
    /// from any older resourceVersion is refused with 410, so the watchers relist.
    pub fn expire_watches(&self) {
        {
            let mut s = self.shared.lock();
            s.compacted = s.rv;
        }
        self.end_watches(true);
    }

    fn end_watches(&self, expired: bool) {
        let mut s = self.shared.lock();
        s.epoch += 1;
        s.expired = expired;
        drop(s);
        self.shared.changed.notify_all();
    }

    /// Holds lists of `kind` back (they wait) until [`Self::release_lists`].
    pub fn hold_lists(&self, kind: &str) {
        self.shared
            .lock()
            .kinds
            .get_mut(kind)
            .expect("a served kind")
            .held = true;
    }

    /// Lets held lists of `kind` answer.
    pub fn release_lists(&self, kind: &str) {
        self.shared
            .lock()
            .kinds
            .get_mut(kind)
            .expect("a served kind")
            .held = false;
        self.shared.changed.notify_all();
    }

    /// (lists answered, watches started) of `kind` so far.
    #[must_use]
    pub fn requests(&self, kind: &str) -> (usize, usize) {
        let s = self.shared.lock();
        let k = &s.kinds[kind];
        (k.lists, k.watches)
    }

    /// Creates or replaces an object (its `kind` and `metadata.name`/`namespace` say which):
    /// a new resourceVersion, an ADDED or MODIFIED event. Returns the resourceVersion.
    pub fn apply(&self, mut object: Value) -> u64 {
        let kind = kind_of(&object);
        let key = key_of(&object);
        let mut s = self.shared.lock();
        s.rv += 1;
        let rv = s.rv;
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        if object["metadata"]["uid"].is_null() {
            object["metadata"]["uid"] = json!(format!("uid-{}-{}-{}", kind, key.0, key.1));
        }
        let k = s.kinds.get_mut(kind).expect("a served kind");
        let kind_event = if k.objects.insert(key, object.clone()).is_some() {
            "MODIFIED"
        } else {
            "ADDED"
        };
        k.log.push((rv, kind_event, object));
        drop(s);
        self.shared.changed.notify_all();
        rv
    }

    /// Deletes an object; a DELETED event. False when it did not exist.
    pub fn delete(&self, kind: &str, namespace: &str, name: &str) -> bool {
        let mut s = self.shared.lock();
        s.rv += 1;
        let rv = s.rv;
        let k = s.kinds.get_mut(kind).expect("a served kind");
        let Some(mut object) = k.objects.remove(&(namespace.to_owned(), name.to_owned())) else {
            return false;
        };
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        k.log.push((rv, "DELETED", object));
        drop(s);
        self.shared.changed.notify_all();
        true
    }

    /// When the event of `kind` at `rv` was written to a watch stream (UNIX time, ns).
    #[must_use]
    pub fn sent_at(&self, kind: &str, rv: u64) -> Option<u128> {
        let s = self.shared.lock();
        let kind = KINDS.iter().find(|(_, k, _)| *k == kind)?.1;
        s.sent_at.get(&(kind, rv)).copied()
    }
}

impl Drop for KubeApi {
    fn drop(&mut self) {
        self.stop();
    }
}

fn kubeconfig_text(addr: SocketAddr) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: wt\n  cluster:\n    server: http://{addr}\nusers:\n- name: wt\n  user: {{}}\ncontexts:\n- name: wt\n  context:\n    cluster: wt\n    user: wt\ncurrent-context: wt\n"
    )
}

/// Binds `ip`:`port` inside namespace `netns` (by name: a thread that entered it binds;
/// the socket stays in that namespace), or in the test's own.
fn try_bind(netns: Option<&str>, ip: IpAddr, port: u16) -> std::io::Result<TcpListener> {
    let Some(name) = netns else {
        return TcpListener::bind((ip, port));
    };
    let path = format!("/run/netns/{name}");
    thread::scope(|scope| {
        scope
            .spawn(|| {
                let file = std::fs::File::open(&path)?;
                nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(std::io::Error::from)?;
                TcpListener::bind((ip, port))
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

fn kind_of(object: &Value) -> &'static str {
    let kind = object["kind"].as_str().unwrap_or_default();
    KINDS
        .iter()
        .find(|(_, k, _)| *k == kind)
        .map(|(_, k, _)| *k)
        .unwrap_or_else(|| panic!("kind {kind:?} is not served"))
}

fn key_of(object: &Value) -> (String, String) {
    let m = &object["metadata"];
    (
        m["namespace"].as_str().unwrap_or_default().to_owned(),
        m["name"].as_str().expect("metadata.name").to_owned(),
    )
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

fn respond(stream: &mut TcpStream, code: u16, body: &Value) -> std::io::Result<()> {
    let body = serde_json::to_vec(body).map_err(std::io::Error::other)?;
    write!(
        stream,
        "HTTP/1.1 {code} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        if code == 200 { "OK" } else { "Error" },
        body.len()
    )?;
    stream.write_all(&body)?;
    stream.flush()
}

fn chunk(stream: &mut TcpStream, line: &Value) -> std::io::Result<()> {
    let mut data = serde_json::to_vec(line).map_err(std::io::Error::other)?;
    data.push(b'\n');
    write!(stream, "{:x}\r\n", data.len())?;
    stream.write_all(&data)?;
    stream.write_all(b"\r\n")?;
    stream.flush()
}

fn query(target: &str) -> (String, HashMap<String, String>) {
    let (path, q) = target.split_once('?').unwrap_or((target, ""));
    let params = q
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (k.to_owned(), v.to_owned())
        })
        .collect();
    (path.to_owned(), params)
}

fn handle(shared: &Shared, running: &AtomicBool, mut stream: TcpStream) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header == "\r\n" {
            break;
        }
    }
    let fault = shared.lock().fault;
    match fault {
        Fault::Drop => return Ok(()),
        Fault::Unavailable => {
            return respond(
                &mut stream,
                503,
                &status(
                    503,
                    "ServiceUnavailable",
                    "the test API server is unavailable",
                ),
            );
        }
        Fault::None => {}
    }
    let target = request_line.split_whitespace().nth(1).unwrap_or("/");
    let (path, params) = query(target);
    if path == "/version" {
        return respond(
            &mut stream,
            200,
            &json!({"major": "1", "minor": "34", "gitVersion": "v1.34.0-weir-test",
                    "platform": "linux/amd64"}),
        );
    }
    let Some((_, kind, api_version)) = KINDS.iter().find(|(p, _, _)| *p == path) else {
        return respond(&mut stream, 404, &status(404, "NotFound", "not served"));
    };
    if params.get("watch").is_some_and(|w| w == "true" || w == "1") {
        watch(shared, running, stream, kind, &params)
    } else {
        list(shared, stream, kind, api_version, &params)
    }
}

fn list(
    shared: &Shared,
    mut stream: TcpStream,
    kind: &'static str,
    api_version: &str,
    params: &HashMap<String, String>,
) -> std::io::Result<()> {
    let mut s = shared.lock();
    while s.kinds[kind].held {
        s = shared
            .changed
            .wait_timeout(s, Duration::from_millis(100))
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .0;
    }
    let limit: usize = params
        .get("limit")
        .and_then(|l| l.parse().ok())
        .filter(|l| *l > 0)
        .unwrap_or(usize::MAX);
    let (rv, mut items) = match params.get("continue").filter(|c| !c.is_empty()) {
        Some(token) => {
            let Some(page) = token.parse().ok().and_then(|t: u64| s.pages.remove(&t)) else {
                drop(s);
                return respond(
                    &mut stream,
                    410,
                    &status(410, "Expired", "the continue token has expired"),
                );
            };
            page
        }
        None => (s.rv, s.kinds[kind].objects.values().cloned().collect()),
    };
    let rest = if items.len() > limit {
        items.split_off(limit)
    } else {
        Vec::new()
    };
    let token = if rest.is_empty() {
        String::new()
    } else {
        let t = s.next_token;
        s.next_token += 1;
        s.pages.insert(t, (rv, rest));
        t.to_string()
    };
    s.kinds.get_mut(kind).expect("a served kind").lists += 1;
    drop(s);
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if !token.is_empty() {
        metadata["continue"] = json!(token);
    }
    respond(
        &mut stream,
        200,
        &json!({"kind": format!("{kind}List"), "apiVersion": api_version,
                "metadata": metadata, "items": items}),
    )
}

fn watch(
    shared: &Shared,
    running: &AtomicBool,
    mut stream: TcpStream,
    kind: &'static str,
    params: &HashMap<String, String>,
) -> std::io::Result<()> {
    let from: u64 = params
        .get("resourceVersion")
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    let bookmarks = params
        .get("allowWatchBookmarks")
        .is_some_and(|b| b == "true");
    let until = Instant::now()
        + Duration::from_secs(
            params
                .get("timeoutSeconds")
                .and_then(|t| t.parse().ok())
                .unwrap_or(290),
        );
    write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )?;
    let mut s = shared.lock();
    s.kinds.get_mut(kind).expect("a served kind").watches += 1;
    if from < s.compacted {
        let compacted = s.compacted;
        drop(s);
        chunk(
            &mut stream,
            &json!({"type": "ERROR", "object": status(410, "Expired",
                &format!("too old resource version: {from} ({compacted})"))}),
        )?;
        return stream.write_all(b"0\r\n\r\n");
    }
    let epoch = s.epoch;
    let mut last = from;
    let mut bookmark_at = Instant::now() + KubeApi::BOOKMARK_EVERY;
    loop {
        if s.epoch != epoch || !running.load(Ordering::SeqCst) {
            let expired = s.expired;
            drop(s);
            if expired {
                chunk(
                    &mut stream,
                    &json!({"type": "ERROR", "object": status(410, "Expired",
                        "too old resource version")}),
                )?;
                stream.write_all(b"0\r\n\r\n")?;
            }
            // Else: the connection just drops, as a crashed server's does.
            return Ok(());
        }
        let new: Vec<(u64, &'static str, Value)> = s.kinds[kind]
            .log
            .iter()
            .filter(|(rv, _, _)| *rv > last)
            .cloned()
            .collect();
        let rv_now = s.rv;
        drop(s);
        for (rv, event, object) in new {
            // Stamped before the write: the agent can act on the event before this thread runs
            // again, and a reader must find the stamp by then.
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            shared.lock().sent_at.insert((kind, rv), now);
            chunk(&mut stream, &json!({"type": event, "object": object}))?;
            last = rv;
        }
        if Instant::now() >= until {
            return stream.write_all(b"0\r\n\r\n");
        }
        if bookmarks && Instant::now() >= bookmark_at {
            let api_version = KINDS
                .iter()
                .find(|(_, k, _)| *k == kind)
                .map_or("v1", |(_, _, v)| *v);
            chunk(
                &mut stream,
                &json!({"type": "BOOKMARK", "object": {"kind": kind, "apiVersion": api_version,
                    "metadata": {"resourceVersion": rv_now.max(last).to_string()}}}),
            )?;
            last = last.max(rv_now);
            bookmark_at = Instant::now() + KubeApi::BOOKMARK_EVERY;
        }
        s = shared.lock();
        if s.kinds[kind]
            .log
            .last()
            .is_none_or(|(rv, _, _)| *rv <= last)
            && s.epoch == epoch
        {
            s = shared
                .changed
                .wait_timeout(s, Duration::from_millis(100))
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }
}
