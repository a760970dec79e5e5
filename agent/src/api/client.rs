//! A client of the agent API over its unix socket (hyper HTTP/1.1), for the operator CLI.

use std::path::{Path, PathBuf};

use http_body_util::{BodyExt as _, Full};
use hyper::{Method, Request, body::Bytes};
use hyper_util::rt::TokioIo;
use serde::{Serialize, de::DeserializeOwned};
use tokio::net::UnixStream;

use super::error::ApiError;

/// Errors of the client.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The agent is not reachable.
    #[error(
        "cannot reach the agent at {path}: {source}; is `weir agent` running (and are you root)?"
    )]
    Unreachable {
        /// The socket.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// HTTP failed.
    #[error("talking to the agent failed: {0}")]
    Http(#[source] hyper::Error),
    /// The agent answered with an error.
    #[error("the agent refused ({code}): {message}")]
    Api {
        /// Its code.
        code: String,
        /// Its message.
        message: String,
    },
    /// The answer does not parse.
    #[error("the agent's answer does not parse: {0}")]
    Decode(#[source] serde_json::Error),
}

/// Calls `method path` with an optional JSON body and decodes the answer.
pub async fn call<B: Serialize, T: DeserializeOwned>(
    socket: &Path,
    method: Method,
    path: &str,
    body: Option<&B>,
) -> Result<T, ClientError> {
    let stream = UnixStream::connect(socket)
        .await
        .map_err(|source| ClientError::Unreachable {
            path: socket.to_owned(),
            source,
        })?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(ClientError::Http)?;
    tokio::spawn(conn);
    let bytes = match body {
        Some(b) => serde_json::to_vec(b).map_err(ClientError::Decode)?,
        None => Vec::new(),
    };
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "weir")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(bytes)))
        .map_err(|e| ClientError::Api {
            code: "client".into(),
            message: e.to_string(),
        })?;
    let response = sender
        .send_request(request)
        .await
        .map_err(ClientError::Http)?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(ClientError::Http)?
        .to_bytes();
    if !status.is_success() {
        #[derive(serde::Deserialize)]
        struct Wrapper {
            error: ApiError,
        }
        return Err(match serde_json::from_slice::<Wrapper>(&body) {
            Ok(w) => ClientError::Api {
                code: w.error.code,
                message: w.error.message,
            },
            Err(_) => ClientError::Api {
                code: status.as_str().into(),
                message: String::from_utf8_lossy(&body).into_owned(),
            },
        });
    }
    serde_json::from_slice(&body).map_err(ClientError::Decode)
}
