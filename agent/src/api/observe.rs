//! The API call of `observe`'s rule hits: `GET /v1/policy/rules`.

use std::sync::Arc;

use axum::{Json, extract::State, http::StatusCode};

use crate::api::{error::ApiError, server::Api};
use crate::observe::rule_hits::{self, RuleHitsView};

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
