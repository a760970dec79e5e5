//! `GET /v1/services`: the source's Services, each frontend with its endpoints and their state
//! (`services::view`), from the loop's snapshot. `weir service list` calls it.
//! `GET /v1/services/flows`: the translated flows in the kernel (`svc_ct4`), each with its
//! Service's name from the snapshot. `weir service flows` calls it.

use std::sync::Arc;

use axum::{Json, extract::State};

use super::{
    error::ApiError,
    server::{Api, blocking},
};
use crate::{
    dataplane::{conntrack::now_ns, service_flows::FlowView},
    services::view::ServiceView,
};

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

/// The translated flows, each with the Service its frontend belongs to.
pub async fn flows(State(api): State<Arc<Api>>) -> Result<Json<Vec<FlowView>>, ApiError> {
    let ct = api.kernel.conntrack(api.ct_layout);
    let mut flows = blocking(move || crate::dataplane::service_flows::list(&*ct, now_ns())).await?;
    let snapshot = api.dataplane.snapshot();
    let names: std::collections::HashMap<&str, &str> = snapshot
        .services
        .iter()
        .flat_map(|views| views.iter())
        .map(|v| (v.frontend.as_str(), v.service.as_str()))
        .collect();
    for f in &mut flows {
        let protocol = match f.protocol {
            6 => "tcp",
            17 => "udp",
            _ => continue,
        };
        let frontend = format!("{}/{protocol}", f.frontend);
        f.service = names.get(frontend.as_str()).map(|s| (*s).to_owned());
    }
    Ok(Json(flows))
}
