//! The agent API client (`docs/agent-api.md`): HTTP/1.1 with JSON bodies over the agent's unix
//! socket, one connection per request, every request bounded by the configured timeout.
//! A socket that cannot be reached, a connection that breaks and a timeout all mean "try again
//! later" (CNI code 11).

use std::{
    collections::BTreeMap,
    net::IpAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use http_body_util::{BodyExt as _, Full};
use hyper::{Method, Request, StatusCode, body::Bytes};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize, de::DeserializeOwned};
use tokio::net::UnixStream;

use crate::error::{CniCode, Code};

/// How long connecting to the socket may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Errors talking to the agent.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// Nothing answers on the socket.
    #[error(
        "the weir agent is unreachable at {socket}: {source}; start the agent (weir agent) or fix agentSocket in the conflist, then retry"
    )]
    Unreachable {
        /// The socket.
        socket: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The connection broke during the request.
    #[error(
        "the weir agent at {socket} stopped answering during {what}: {source}; retry once it runs"
    )]
    Transport {
        /// The socket.
        socket: PathBuf,
        /// The request.
        what: &'static str,
        /// The cause.
        #[source]
        source: hyper::Error,
    },
    /// The request took too long.
    #[error(
        "the weir agent at {socket} did not answer {what} within {secs} s; retry, or raise agentTimeoutSecs"
    )]
    Timeout {
        /// The socket.
        socket: PathBuf,
        /// The request.
        what: &'static str,
        /// The timeout.
        secs: u64,
    },
    /// The agent answered with an error object.
    #[error("the weir agent refused {what}: {message} ({code}, HTTP {status})")]
    Api {
        /// The request.
        what: &'static str,
        /// HTTP status.
        status: u16,
        /// The agent's error code (`exhausted`, …).
        code: String,
        /// The agent's message.
        message: String,
    },
    /// The agent answered with something this plugin cannot read.
    #[error(
        "the weir agent answered {what} with HTTP {status} and a body weir-cni cannot read; check that weir-cni and the agent are the same release"
    )]
    BadResponse {
        /// The request.
        what: &'static str,
        /// HTTP status.
        status: u16,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// The request could not be built (a bug, never bad input).
    #[error("cannot build the {what} request: {source}")]
    Request {
        /// The request.
        what: &'static str,
        /// The cause.
        #[source]
        source: hyper::http::Error,
    },
}

impl CniCode for AgentError {
    fn code(&self) -> Code {
        match self {
            Self::Unreachable { .. } | Self::Transport { .. } | Self::Timeout { .. } => {
                Code::TryAgainLater
            }
            Self::Api { status, code, .. } => match code.as_str() {
                "exhausted" | "address-in-use" | "address-not-in-pool" => Code::Ipam,
                "unknown-pool" => Code::InvalidConfig,
                "not-ready" | "unavailable" => Code::TryAgainLater,
                _ if *status == 503 => Code::TryAgainLater,
                _ => Code::Agent,
            },
            Self::BadResponse { .. } | Self::Request { .. } => Code::Agent,
        }
    }
}

/// `GET /v1/status`.
#[derive(Debug, Clone, Deserialize)]
pub struct Status {
    /// Ready to serve.
    pub ready: bool,
    /// The agent's pin root (absent from older agents).
    #[serde(default)]
    pub bpf_root: Option<std::path::PathBuf>,
    /// Pools.
    #[serde(default)]
    pub pools: Vec<PoolStatus>,
}

/// One pool in the status.
#[derive(Debug, Clone, Deserialize)]
pub struct PoolStatus {
    /// Name.
    pub name: String,
    /// CIDR.
    pub cidr: String,
    /// Free addresses.
    pub free: u64,
    /// Disabled pools take no new allocations.
    #[serde(default)]
    pub disabled: bool,
}

/// `POST /v1/ipam/allocate`.
#[derive(Debug, Clone, Serialize)]
pub struct AllocateRequest {
    /// `<network>.<container id>`.
    pub handle: String,
    /// IPv4 addresses wanted.
    pub ipv4: u32,
    /// IPv6 addresses wanted.
    pub ipv6: u32,
    /// Restrict to these pools.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<String>,
    /// Exact addresses wanted (instead of counts).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<IpAddr>,
    /// Pod namespace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Pod name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// Container id.
    pub container_id: String,
    /// Expiry of the unconfirmed allocation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_in_secs: Option<u64>,
}

/// The answer to an allocation.
#[derive(Debug, Clone, Deserialize)]
pub struct Allocation {
    /// The addresses.
    pub ips: Vec<IpAddr>,
    /// The agent's pin root (absent from older agents).
    #[serde(default)]
    pub bpf_root: Option<std::path::PathBuf>,
    /// How the agent attaches the endpoint programs (absent from older agents).
    #[serde(default)]
    pub tc_attach: Option<::attach::Mechanism>,
}

/// `GET /v1/ipam/handles/{handle}`: what the agent holds under a handle.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct HandleStatus {
    /// The addresses held (none once released).
    #[serde(default)]
    pub ips: Vec<IpAddr>,
    /// Whether an endpoint confirmed the allocation (unconfirmed ones expire).
    #[serde(default)]
    pub confirmed: bool,
}

/// The answer to a release.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Released {
    /// Released now.
    #[serde(default)]
    pub released: Vec<String>,
    /// Already free.
    #[serde(default)]
    pub not_allocated: Vec<String>,
}

/// An endpoint (`PUT /v1/endpoints/{container_id}:{ifname}`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Endpoint {
    /// Container id.
    pub container_id: String,
    /// Pod interface.
    pub ifname: String,
    /// Host veth.
    pub host_ifname: String,
    /// Pod netns path.
    #[serde(default)]
    pub netns: String,
    /// Pod namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Pod name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// Labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// IPAM handle.
    pub handle: String,
    /// Addresses.
    pub ips: Vec<IpAddr>,
}

/// The answer to an endpoint deletion.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Deleted {
    /// True when an endpoint was there.
    #[serde(default)]
    pub deleted: bool,
    /// Addresses released with it.
    #[serde(default)]
    pub released: Vec<String>,
    /// The agent's pin root (absent from older agents).
    #[serde(default)]
    pub bpf_root: Option<std::path::PathBuf>,
}

#[derive(Debug, Deserialize)]
struct ErrorBody {
    error: ErrorObject,
}

#[derive(Debug, Deserialize)]
struct ErrorObject {
    code: String,
    message: String,
}

/// A client of one agent socket.
#[derive(Debug, Clone)]
pub struct AgentClient {
    socket: PathBuf,
    timeout: Duration,
}

impl AgentClient {
    /// A client for `socket`; every request is bounded by `timeout`.
    #[must_use]
    pub fn new(socket: &Path, timeout: Duration) -> Self {
        Self {
            socket: socket.to_owned(),
            timeout,
        }
    }

    /// `GET /v1/status`.
    pub async fn status(&self) -> Result<Status, AgentError> {
        self.call(Method::GET, "/v1/status", None, "the status request")
            .await
    }

    /// `POST /v1/ipam/allocate`.
    pub async fn allocate(&self, request: &AllocateRequest) -> Result<Allocation, AgentError> {
        let body = to_body(request);
        self.call(
            Method::POST,
            "/v1/ipam/allocate",
            Some(body),
            "the allocation",
        )
        .await
    }

    /// `POST /v1/ipam/release` by handle (idempotent).
    pub async fn release_handle(&self, handle: &str) -> Result<Released, AgentError> {
        let body = serde_json::json!({ "handle": handle }).to_string();
        self.call(Method::POST, "/v1/ipam/release", Some(body), "the release")
            .await
    }

    /// `GET /v1/ipam/handles/{handle}`; a handle the agent does not know holds nothing.
    pub async fn get_handle(&self, handle: &str) -> Result<HandleStatus, AgentError> {
        // Handles are `<network>.<container id>`, both validated: safe in a path segment.
        let path = format!("/v1/ipam/handles/{handle}");
        match self
            .call(Method::GET, &path, None, "the allocation lookup")
            .await
        {
            Err(AgentError::Api { status: 404, .. }) => Ok(HandleStatus::default()),
            other => other,
        }
    }

    /// `PUT /v1/endpoints/{container_id}:{ifname}`.
    pub async fn put_endpoint(&self, endpoint: &Endpoint) -> Result<Endpoint, AgentError> {
        let path = endpoint_path(&endpoint.container_id, &endpoint.ifname);
        self.call(
            Method::PUT,
            &path,
            Some(to_body(endpoint)),
            "the endpoint registration",
        )
        .await
    }

    /// `GET /v1/endpoints/{container_id}:{ifname}`; `None` on 404.
    pub async fn get_endpoint(
        &self,
        container_id: &str,
        ifname: &str,
    ) -> Result<Option<Endpoint>, AgentError> {
        let path = endpoint_path(container_id, ifname);
        match self
            .call(Method::GET, &path, None, "the endpoint lookup")
            .await
        {
            Ok(endpoint) => Ok(Some(endpoint)),
            Err(AgentError::Api { status: 404, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `GET /v1/endpoints`.
    pub async fn list_endpoints(&self) -> Result<Vec<Endpoint>, AgentError> {
        self.call(Method::GET, "/v1/endpoints", None, "the endpoint list")
            .await
    }

    /// `DELETE /v1/endpoints/{container_id}:{ifname}?release=true` (idempotent).
    pub async fn delete_endpoint(
        &self,
        container_id: &str,
        ifname: &str,
    ) -> Result<Deleted, AgentError> {
        let path = format!("{}?release=true", endpoint_path(container_id, ifname));
        self.call(Method::DELETE, &path, None, "the endpoint deletion")
            .await
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<String>,
        what: &'static str,
    ) -> Result<T, AgentError> {
        let secs = self.timeout.as_secs();
        let (status, bytes) =
            tokio::time::timeout(self.timeout, self.exchange(method, path, body, what))
                .await
                .map_err(|_| AgentError::Timeout {
                    socket: self.socket.clone(),
                    what,
                    secs,
                })??;
        if status.is_success() {
            return serde_json::from_slice(&bytes).map_err(|source| AgentError::BadResponse {
                what,
                status: status.as_u16(),
                source,
            });
        }
        let error = match serde_json::from_slice::<ErrorBody>(&bytes) {
            Ok(body) => body.error,
            Err(_) => ErrorObject {
                code: format!("http-{}", status.as_u16()),
                message: String::from_utf8_lossy(&bytes)
                    .trim()
                    .chars()
                    .take(300)
                    .collect(),
            },
        };
        Err(AgentError::Api {
            what,
            status: status.as_u16(),
            code: error.code,
            message: error.message,
        })
    }

    async fn exchange(
        &self,
        method: Method,
        path: &str,
        body: Option<String>,
        what: &'static str,
    ) -> Result<(StatusCode, Bytes), AgentError> {
        let unreachable = |source| AgentError::Unreachable {
            socket: self.socket.clone(),
            source,
        };
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, UnixStream::connect(&self.socket))
            .await
            .map_err(|_| unreachable(std::io::Error::from(std::io::ErrorKind::TimedOut)))?
            .map_err(unreachable)?;
        let transport = |source| AgentError::Transport {
            socket: self.socket.clone(),
            what,
            source,
        };
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(transport)?;
        let driver = tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "agent connection ended");
            }
        });
        let mut builder = Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, "weir-agent");
        if body.is_some() {
            builder = builder.header(hyper::header::CONTENT_TYPE, "application/json");
        }
        let request = builder
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|source| AgentError::Request { what, source })?;
        let response = sender.send_request(request).await.map_err(transport)?;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(transport)?
            .to_bytes();
        driver.abort();
        Ok((status, bytes))
    }
}

fn endpoint_path(container_id: &str, ifname: &str) -> String {
    // Both are validated (letters, digits, `_.-` and no `/`, `:` or whitespace), so they are safe
    // in a path segment.
    format!("/v1/endpoints/{container_id}:{ifname}")
}

fn to_body<T: Serialize>(value: &T) -> String {
    // Serialising these plain structs cannot fail.
    serde_json::to_string(value).unwrap_or_default()
}

#[cfg(test)]
pub mod fake;

#[cfg(test)]
mod tests {
    use super::*;

    fn client(path: &Path) -> AgentClient {
        AgentClient::new(path, Duration::from_secs(5))
    }

    #[tokio::test]
    async fn a_missing_socket_is_try_again_later() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = client(&dir.path().join("none.sock"))
            .status()
            .await
            .expect_err("no agent");
        assert_eq!(err.code(), Code::TryAgainLater);
        assert!(err.to_string().contains("unreachable"), "{err}");
    }

    #[tokio::test]
    async fn requests_and_errors_round_trip_through_a_fake_agent() {
        let agent = fake::FakeAgent::start();
        let c = client(agent.socket());
        let status = c.status().await.expect("status");
        assert!(status.ready);
        let allocation = c
            .allocate(&AllocateRequest {
                handle: "n.c1".into(),
                ipv4: 1,
                ipv6: 1,
                pools: Vec::new(),
                ips: Vec::new(),
                namespace: None,
                pod: None,
                container_id: "c1".into(),
                expires_in_secs: None,
            })
            .await
            .expect("allocate");
        assert_eq!(allocation.ips.len(), 2);
        assert!(c.get_endpoint("c1", "eth0").await.expect("get").is_none());
        agent.state().lock().expect("lock").exhausted = true;
        let err = c
            .allocate(&AllocateRequest {
                handle: "n.c2".into(),
                ipv4: 1,
                ipv6: 0,
                pools: Vec::new(),
                ips: Vec::new(),
                namespace: None,
                pod: None,
                container_id: "c2".into(),
                expires_in_secs: None,
            })
            .await
            .expect_err("exhausted");
        assert_eq!(err.code(), Code::Ipam);
        let released = c.release_handle("n.c1").await.expect("release");
        assert_eq!(released.released.len(), 2);
    }
}
