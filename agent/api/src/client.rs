//! The one client of the agent API: HTTP/1.1 with JSON bodies over the agent's unix socket, one
//! connection per request, every request bounded by the client's timeout. Used by the operator
//! CLI (`weir status`, `weir endpoint`, `weir bpf`, `weir ipam` through the agent) and by
//! weir-cni. A socket that cannot be reached, a connection that breaks and a timeout are
//! distinct errors ([`ClientError::is_unavailable`]: weir-cni's "try again later").

use std::{
    ops::ControlFlow,
    path::{Path, PathBuf},
    time::Duration,
};

use http_body_util::{BodyExt as _, Full};
pub use hyper::Method;
use hyper::{
    Request, Response, StatusCode,
    body::{Bytes, Incoming},
};
use hyper_util::rt::TokioIo;
use serde::{Serialize, de::DeserializeOwned};
use tokio::net::UnixStream;

use crate::{
    AllocateRequest, AllocateResponse, DeleteResponse, EndpointRequest, EndpointView, ErrorBody,
    HandleStatus, ReleaseRequest, ReleaseResponse, Status, endpoint_key,
};

/// How long connecting to the socket may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How much of an unreadable error body an error keeps.
const BODY_EXCERPT: usize = 300;

/// Errors talking to the agent.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing answers on the socket.
    #[error(
        "the weir agent is unreachable at {socket}: {source}; is `weir agent` running (and are you root)? Start it, or fix the socket path (--api-socket, or agentSocket in the CNI conflist), then retry"
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
        "the weir agent at {socket} did not answer {what} within {secs} s; retry (weir-cni: or raise agentTimeoutSecs)"
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
        /// The agent's error code ([`crate::code`]; `http-<status>` when the body had none).
        code: String,
        /// The agent's message.
        message: String,
    },
    /// The agent answered with something this client cannot read.
    #[error(
        "the weir agent answered {what} with HTTP {status} and a body this client cannot read ({source}); check that the client and the agent are the same release"
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
    /// The request body could not be encoded (a bug, never bad input).
    #[error("cannot encode the body of {what}: {source}")]
    Encode {
        /// The request.
        what: &'static str,
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

impl ClientError {
    /// True when the agent could not be asked or did not answer in time: retry later.
    #[must_use]
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            Self::Unreachable { .. } | Self::Transport { .. } | Self::Timeout { .. }
        )
    }

    /// The HTTP status of an error answer.
    #[must_use]
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Api { status, .. } | Self::BadResponse { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// A client of one agent socket.
#[derive(Debug, Clone)]
pub struct Client {
    socket: PathBuf,
    timeout: Duration,
}

impl Client {
    /// A client for `socket`; every request is bounded by `timeout`.
    #[must_use]
    pub fn new(socket: &Path, timeout: Duration) -> Self {
        Self {
            socket: socket.to_owned(),
            timeout,
        }
    }

    /// The socket.
    #[must_use]
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// `GET /v1/status`.
    pub async fn status(&self) -> Result<Status, ClientError> {
        self.get("/v1/status", "the status request").await
    }

    /// `POST /v1/ipam/allocate`.
    pub async fn allocate(
        &self,
        request: &AllocateRequest,
    ) -> Result<AllocateResponse, ClientError> {
        self.post("/v1/ipam/allocate", request, "the allocation")
            .await
    }

    /// `POST /v1/ipam/release` by handle (idempotent).
    pub async fn release_handle(&self, handle: &str) -> Result<ReleaseResponse, ClientError> {
        let request = ReleaseRequest {
            handle: Some(handle.to_owned()),
            ips: Vec::new(),
        };
        self.post("/v1/ipam/release", &request, "the release").await
    }

    /// `GET /v1/ipam/handles/{handle}`; a handle the agent does not know holds nothing.
    pub async fn get_handle(&self, handle: &str) -> Result<HandleStatus, ClientError> {
        // Handles are `<network>.<container id>`, both validated: safe in a path segment.
        let path = format!("/v1/ipam/handles/{handle}");
        match self.get(&path, "the allocation lookup").await {
            Err(ClientError::Api { status: 404, .. }) => Ok(HandleStatus::default()),
            other => other,
        }
    }

    /// `PUT /v1/endpoints/{container_id}:{ifname}`: answers once the endpoint's map entries
    /// are written.
    pub async fn put_endpoint(
        &self,
        endpoint: &EndpointRequest,
    ) -> Result<EndpointView, ClientError> {
        let path = endpoint_path(&endpoint.container_id, &endpoint.ifname);
        self.call(
            Method::PUT,
            &path,
            Some(endpoint),
            "the endpoint registration",
        )
        .await
    }

    /// `GET /v1/endpoints/{container_id}:{ifname}`; `None` on 404.
    pub async fn get_endpoint(
        &self,
        container_id: &str,
        ifname: &str,
    ) -> Result<Option<EndpointView>, ClientError> {
        self.get_endpoint_by_key(&endpoint_key(container_id, ifname))
            .await
    }

    /// `GET /v1/endpoints/{key}` (`<container_id>:<ifname>`); `None` on 404.
    pub async fn get_endpoint_by_key(
        &self,
        key: &str,
    ) -> Result<Option<EndpointView>, ClientError> {
        match self
            .get(&format!("/v1/endpoints/{key}"), "the endpoint lookup")
            .await
        {
            Ok(endpoint) => Ok(Some(endpoint)),
            Err(ClientError::Api { status: 404, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `GET /v1/endpoints`.
    pub async fn list_endpoints(&self) -> Result<Vec<EndpointView>, ClientError> {
        self.get("/v1/endpoints", "the endpoint list").await
    }

    /// `DELETE /v1/endpoints/{container_id}:{ifname}?release=true` (idempotent): removes the
    /// endpoint's map entries and releases its handle's addresses.
    pub async fn delete_endpoint(
        &self,
        container_id: &str,
        ifname: &str,
    ) -> Result<DeleteResponse, ClientError> {
        let path = format!("{}?release=true", endpoint_path(container_id, ifname));
        self.delete(&path, "the endpoint deletion").await
    }

    /// `GET path`, decoded as `T`.
    pub async fn get<T: DeserializeOwned>(
        &self,
        path: &str,
        what: &'static str,
    ) -> Result<T, ClientError> {
        self.call::<(), T>(Method::GET, path, None, what).await
    }

    /// `POST path` with a JSON body, decoded as `T`.
    pub async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
        what: &'static str,
    ) -> Result<T, ClientError> {
        self.call(Method::POST, path, Some(body), what).await
    }

    /// `DELETE path`, decoded as `T`.
    pub async fn delete<T: DeserializeOwned>(
        &self,
        path: &str,
        what: &'static str,
    ) -> Result<T, ClientError> {
        self.call::<(), T>(Method::DELETE, path, None, what).await
    }

    /// `method path` with an optional JSON body; a success is decoded as `T`, an error answer
    /// becomes [`ClientError::Api`]. `what` names the request in errors.
    pub async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
        what: &'static str,
    ) -> Result<T, ClientError> {
        let body = body
            .map(serde_json::to_vec)
            .transpose()
            .map_err(|source| ClientError::Encode { what, source })?;
        let secs = self.timeout.as_secs();
        let (status, bytes) =
            tokio::time::timeout(self.timeout, self.exchange(method, path, body, what))
                .await
                .map_err(|_| ClientError::Timeout {
                    socket: self.socket.clone(),
                    what,
                    secs,
                })??;
        if status.is_success() {
            return serde_json::from_slice(&bytes).map_err(|source| ClientError::BadResponse {
                what,
                status: status.as_u16(),
                source,
            });
        }
        Err(error_answer(status, &bytes, what))
    }

    /// `GET path` answered by a stream of JSON lines (`GET /v1/monitor`): `ready` is called once
    /// the agent has answered (what it streams from then on reaches `each`), then every line,
    /// decoded as `T`, goes to `each` until it returns [`ControlFlow::Break`] or the agent ends
    /// the stream. The answer must start within the client's timeout; the stream has none.
    pub async fn stream_lines<T: DeserializeOwned>(
        &self,
        path: &str,
        what: &'static str,
        ready: impl FnOnce(),
        mut each: impl FnMut(T) -> ControlFlow<()>,
    ) -> Result<(), ClientError> {
        let secs = self.timeout.as_secs();
        let (response, driver) =
            tokio::time::timeout(self.timeout, self.send(Method::GET, path, None, what))
                .await
                .map_err(|_| ClientError::Timeout {
                    socket: self.socket.clone(),
                    what,
                    secs,
                })??;
        let _driver = AbortOnDrop(driver);
        let status = response.status();
        let mut body = response.into_body();
        let transport = |source| ClientError::Transport {
            socket: self.socket.clone(),
            what,
            source,
        };
        if !status.is_success() {
            let bytes = body.collect().await.map_err(transport)?.to_bytes();
            return Err(error_answer(status, &bytes, what));
        }
        ready();
        let mut pending: Vec<u8> = Vec::new();
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame.map_err(transport)?.into_data() else {
                continue;
            };
            pending.extend_from_slice(&data);
            while let Some(end) = pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = pending.drain(..=end).collect();
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let item =
                    serde_json::from_slice(&line).map_err(|source| ClientError::BadResponse {
                        what,
                        status: status.as_u16(),
                        source,
                    })?;
                if each(item).is_break() {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    async fn exchange(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        what: &'static str,
    ) -> Result<(StatusCode, Bytes), ClientError> {
        let (response, driver) = self.send(method, path, body, what).await?;
        let _driver = AbortOnDrop(driver);
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|source| ClientError::Transport {
                socket: self.socket.clone(),
                what,
                source,
            })?
            .to_bytes();
        Ok((status, bytes))
    }

    /// Connects, sends the request and waits for the answer's head; the task driving the
    /// connection must live as long as the body is read.
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        what: &'static str,
    ) -> Result<(Response<Incoming>, tokio::task::JoinHandle<()>), ClientError> {
        let unreachable = |source| ClientError::Unreachable {
            socket: self.socket.clone(),
            source,
        };
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, UnixStream::connect(&self.socket))
            .await
            .map_err(|_| unreachable(std::io::Error::from(std::io::ErrorKind::TimedOut)))?
            .map_err(unreachable)?;
        let transport = |source| ClientError::Transport {
            socket: self.socket.clone(),
            what,
            source,
        };
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(transport)?;
        // Ends by itself when the connection fails; the caller aborts it once done.
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
            .map_err(|source| ClientError::Request { what, source })?;
        let response = sender.send_request(request).await.map_err(transport)?;
        Ok((response, driver))
    }
}

/// Aborts the connection task when the request is done with (or abandoned).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The error of a non-success answer: the agent's error object, or the raw body.
fn error_answer(status: StatusCode, bytes: &[u8], what: &'static str) -> ClientError {
    let (code, message) = match serde_json::from_slice::<ErrorBody>(bytes) {
        Ok(body) => (body.error.code, body.error.message),
        Err(_) => (
            format!("http-{}", status.as_u16()),
            String::from_utf8_lossy(bytes)
                .trim()
                .chars()
                .take(BODY_EXCERPT)
                .collect(),
        ),
    };
    ClientError::Api {
        what,
        status: status.as_u16(),
        code,
        message,
    }
}

fn endpoint_path(container_id: &str, ifname: &str) -> String {
    // Both are validated (letters, digits, `_.-` and no `/`, `:` or whitespace), so they are safe
    // in a path segment.
    format!("/v1/endpoints/{}", endpoint_key(container_id, ifname))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_missing_socket_is_unreachable_and_says_what_to_start() {
        let dir = tempfile::tempdir().expect("tempdir");
        let client = Client::new(&dir.path().join("none.sock"), Duration::from_secs(5));
        let err = client.status().await.expect_err("no agent");
        assert!(err.is_unavailable(), "{err:?}");
        assert!(err.to_string().contains("unreachable"), "{err}");
        assert!(err.to_string().contains("is `weir agent` running"), "{err}");
    }
}
