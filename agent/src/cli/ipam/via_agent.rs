//! Running a `weir ipam` operation inside the agent that holds the embedded file (`POST /v1/ipam/ops`).
//!
//! The agent holds its embedded file exclusively (one fsync per commit) and group-commits what it is asked, so a
//! command it runs costs a round trip on its socket instead of opening the file, committing and closing (several
//! fsyncs). When no agent answers on the socket, or the one that answers holds another datastore, the command
//! opens the file itself, as it does without an agent.

use std::{path::Path, time::Duration};

use ipam::ops::{Operation, Outcome};

use weir_api::{Client, ClientError, code::NOT_THIS_DATASTORE};

/// `POST /v1/ipam/ops` body: the operation is the IPAM library's.
type IpamOpsRequest = weir_api::IpamOpsRequest<Operation>;

/// How long the agent may take to answer (it answers once the operation's commit is durable).
const ANSWER_WITHIN: Duration = Duration::from_secs(60);

/// Runs `op` in the agent on `socket` if it holds `file`; `None` when it cannot (no agent answers, or the agent
/// holds another datastore): then the caller opens the file itself.
pub(super) async fn execute(
    socket: &Path,
    file: &Path,
    op: &Operation,
) -> anyhow::Result<Option<Outcome>> {
    let file = std::path::absolute(file).unwrap_or_else(|_| file.to_owned());
    let request = IpamOpsRequest {
        datastore: format!("embedded:{}", file.display()),
        operation: op.clone(),
    };
    let answer = Client::new(socket, ANSWER_WITHIN)
        .post("/v1/ipam/ops", &request, "the ipam operation")
        .await;
    match answer {
        Ok(outcome) => Ok(Some(outcome)),
        // Nothing was sent: nobody listens there (or we may not connect).
        Err(ClientError::Unreachable { .. }) => Ok(None),
        // An agent on another datastore, or one from before this API.
        Err(ClientError::Api { code, status, .. })
            if code == NOT_THIS_DATASTORE || status == 404 =>
        {
            Ok(None)
        }
        Err(ClientError::Timeout { .. }) => Err(anyhow::anyhow!(
            "the agent on {} did not answer within {} s; the operation may or may not have been applied: \
             check with `weir ipam show`",
            socket.display(),
            ANSWER_WITHIN.as_secs()
        )),
        // The agent ran the operation and it failed: its message is the datastore's own.
        Err(ClientError::Api { message, .. }) => Err(anyhow::anyhow!(message)),
        Err(e) => Err(e.into()),
    }
}
