//! `GET /v1/services`: the source's Services, each frontend with its endpoints and their state
//! (`services::view`), from the loop's snapshot. `weir service list` calls it.

use std::sync::Arc;

use axum::{Json, extract::State};

use super::server::Api;
use crate::services::view::ServiceView;

/// The handler.
pub async fn list(State(api): State<Arc<Api>>) -> Json<Vec<ServiceView>> {
    let snapshot = api.dataplane.snapshot();
    Json(
        snapshot
            .services
            .iter()
            .flat_map(|views| views.iter().cloned())
            .collect(),
    )
}
