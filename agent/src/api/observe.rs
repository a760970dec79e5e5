//! The API calls of `observe`: `GET /v1/policy/rules` (rule hits) and the kernel half of
//! `POST /v1/policy/trace`.

use std::sync::Arc;

use axum::{Json, extract::State, http::StatusCode};

use crate::observe::rule_hits::{self, RuleHitsView};
use crate::{
    api::{error::ApiError, server::Api},
    control::node::Node,
    kernel::TraceIo,
    observe::trace::{TraceRequest, TraceResult},
};

/// `GET /v1/policy/rules`: every rule the agent compiled, with the packets and bytes it decided.
/// The rule names come from the loop's published snapshot; the counters from the pinned map.
pub async fn rules(State(api): State<Arc<Api>>) -> Result<Json<Vec<RuleHitsView>>, ApiError> {
    let rules = Arc::clone(&api.dataplane.snapshot().rules);
    let kernel = Arc::clone(&api.kernel);
    let internal = |e: String| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e);
    tokio::task::spawn_blocking(move || rule_hits::read(&*kernel, &rules))
        .await
        .map_err(|e| internal(format!("the rule hits reader failed: {e}")))?
        .map(Json)
        .map_err(|e| internal(e.to_string()))
}

/// Runs the kernel trace beside the user-space one; a failure is reported in the answer.
pub fn add_kernel_trace(
    kernel: &dyn TraceIo,
    node: &Node,
    req: &TraceRequest,
    proto: u8,
    result: &mut TraceResult,
) {
    match crate::observe::ktrace::trace(kernel, node, req, proto, &result.verdict) {
        Ok(k) => result.kernel = Some(k),
        Err(e) => result.kernel_error = Some(e.to_string()),
    }
}
