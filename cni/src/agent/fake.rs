//! A fake agent for unit tests: a tiny HTTP/1.1 server on a temporary unix socket that answers
//! the API of `docs/agent-api.md` from memory. Test code only.

use std::{
    collections::BTreeMap,
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::IpAddr,
    os::unix::net::{UnixListener, UnixStream},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use serde_json::{Value, json};

/// What the fake agent holds.
#[derive(Debug, Default)]
pub struct FakeState {
    /// Allocations by handle.
    pub allocations: BTreeMap<String, Vec<IpAddr>>,
    /// Endpoints by `container_id:ifname`.
    pub endpoints: BTreeMap<String, Value>,
    /// Answer allocations with `exhausted`.
    pub exhausted: bool,
    /// `ready` in the status.
    pub not_ready: bool,
    /// Next host number.
    pub next: u32,
    /// Every request line seen.
    pub requests: Vec<String>,
}

/// A running fake agent; its thread ends with the test process.
#[derive(Debug)]
pub struct FakeAgent {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    state: Arc<Mutex<FakeState>>,
}

impl FakeAgent {
    /// Starts serving on a fresh socket.
    #[must_use]
    pub fn start() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("weir.sock");
        let listener = UnixListener::bind(&socket).expect("bind");
        let state = Arc::new(Mutex::new(FakeState {
            next: 2,
            ..FakeState::default()
        }));
        let shared = Arc::clone(&state);
        std::thread::spawn(move || {
            for stream in listener.incoming().map_while(Result::ok) {
                let shared = Arc::clone(&shared);
                std::thread::spawn(move || serve(stream, &shared));
            }
        });
        Self {
            _dir: dir,
            socket,
            state,
        }
    }

    /// The socket.
    #[must_use]
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The state, to inspect or change.
    #[must_use]
    pub fn state(&self) -> &Arc<Mutex<FakeState>> {
        &self.state
    }
}

fn serve(stream: UnixStream, state: &Mutex<FakeState>) {
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_owned();
    let target = parts.next().unwrap_or_default().to_owned();
    let mut length = 0usize;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).is_err() || header.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = header.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            length = v.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; length];
    let _ = reader.read_exact(&mut body);
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let (status, answer) = {
        let mut state = state.lock().expect("lock");
        state.requests.push(format!("{method} {target}"));
        route(&mut state, &method, &target, &body)
    };
    let text = answer.to_string();
    let mut stream = stream;
    let _ = write!(
        stream,
        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
        text.len()
    );
}

fn error(status: u16, code: &str, message: &str) -> (u16, Value) {
    (status, json!({"error": {"code": code, "message": message}}))
}

fn route(state: &mut FakeState, method: &str, target: &str, body: &Value) -> (u16, Value) {
    let path = target.split('?').next().unwrap_or_default();
    match (method, path) {
        ("GET", "/v1/status") => (
            200,
            json!({"ready": !state.not_ready, "node": "fake", "endpoints": state.endpoints.len(),
                   "pools": [{"name": "default-ipv4", "cidr": "10.244.0.0/16", "free": 100, "disabled": false},
                             {"name": "default-ipv6", "cidr": "fd00::/64", "free": 100, "disabled": false}]}),
        ),
        ("POST", "/v1/ipam/allocate") => {
            if state.exhausted {
                return error(409, "exhausted", "pools default-ipv4 are full");
            }
            let handle = body["handle"].as_str().unwrap_or_default().to_owned();
            let n = state.next;
            state.next += 1;
            let mut ips: Vec<IpAddr> = Vec::new();
            if let Some(requested) = body["ips"].as_array() {
                ips.extend(
                    requested
                        .iter()
                        .filter_map(|v| v.as_str()?.parse::<IpAddr>().ok()),
                );
            } else {
                if body["ipv4"].as_u64() == Some(1) {
                    ips.push(format!("10.244.0.{n}").parse().expect("ip"));
                }
                if body["ipv6"].as_u64() == Some(1) {
                    ips.push(format!("fd00::{n:x}").parse().expect("ip"));
                }
            }
            state.allocations.insert(handle.clone(), ips.clone());
            (200, json!({"handle": handle, "ips": ips, "expires_at": 0}))
        }
        ("POST", "/v1/ipam/release") => {
            let handle = body["handle"].as_str().unwrap_or_default();
            let released = state.allocations.remove(handle).unwrap_or_default();
            (200, json!({"released": released, "not_allocated": []}))
        }
        ("GET", p) if p.starts_with("/v1/ipam/handles/") => {
            let handle = p.trim_start_matches("/v1/ipam/handles/");
            let ips = state.allocations.get(handle).cloned().unwrap_or_default();
            let confirmed = state
                .endpoints
                .values()
                .any(|e| e["handle"].as_str() == Some(handle));
            (
                200,
                json!({"handle": handle, "ips": ips, "confirmed": confirmed && !ips.is_empty(), "expires_at": null}),
            )
        }
        ("GET", "/v1/endpoints") => (
            200,
            Value::Array(state.endpoints.values().cloned().collect()),
        ),
        (_, p) if p.starts_with("/v1/endpoints/") => {
            let key = p.trim_start_matches("/v1/endpoints/").to_owned();
            match method {
                "PUT" => {
                    state.endpoints.insert(key, body.clone());
                    (200, body.clone())
                }
                "GET" => match state.endpoints.get(&key) {
                    Some(ep) => (200, ep.clone()),
                    None => error(404, "not-found", "no such endpoint"),
                },
                "DELETE" => {
                    let ep = state.endpoints.remove(&key);
                    let released = ep
                        .as_ref()
                        .and_then(|e| e["handle"].as_str())
                        .and_then(|h| state.allocations.remove(h))
                        .unwrap_or_default();
                    (200, json!({"deleted": ep.is_some(), "released": released}))
                }
                _ => error(405, "method-not-allowed", method),
            }
        }
        _ => error(404, "not-found", target),
    }
}
