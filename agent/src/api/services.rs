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
    calc::services::view::ServiceView, dataplane::service_flows::FlowView, kernel::real::ct::now_ns,
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
    name(
        &mut flows,
        snapshot.services.iter().flat_map(|views| views.iter()),
    );
    Ok(Json(flows))
}

/// Gives each flow the Service of its frontend among `views`: the frontend itself, or for a
/// packet to a node address the NodePort of that port (`*:PORT/proto`).
fn name<'a>(flows: &mut [FlowView], views: impl Iterator<Item = &'a ServiceView>) {
    let names: std::collections::HashMap<&str, &str> = views
        .map(|v| (v.frontend.as_str(), v.service.as_str()))
        .collect();
    for f in flows {
        let protocol = match f.protocol {
            6 => "tcp",
            17 => "udp",
            _ => continue,
        };
        let port = f.frontend.rsplit_once(':').map_or("", |(_, p)| p);
        let exact = format!("{}/{protocol}", f.frontend);
        let node_port = format!("*:{port}/{protocol}");
        f.service = names
            .get(exact.as_str())
            .or_else(|| names.get(node_port.as_str()))
            .map(|s| (*s).to_owned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(service: &str, frontend: &str) -> ServiceView {
        serde_json::from_value(serde_json::json!({
            "service": service, "frontend": frontend, "backends": []
        }))
        .expect("a view")
    }

    fn flow(protocol: u8, frontend: &str) -> FlowView {
        FlowView {
            protocol,
            client: "10.244.0.7:40000".to_owned(),
            frontend: frontend.to_owned(),
            backend: "10.244.0.5:8080".to_owned(),
            service: None,
            idle_secs: None,
            age_secs: 0,
        }
    }

    #[test]
    fn a_flow_is_named_by_its_frontend_or_its_node_port() {
        let views = [
            view("prod/web", "10.96.0.10:80/tcp"),
            view("prod/dns", "10.96.0.10:53/udp"),
            view("prod/np", "*:30080/tcp"),
        ];
        let mut flows = [
            flow(6, "10.96.0.10:80"),
            flow(17, "10.96.0.10:53"),
            flow(6, "192.0.2.1:30080"),
            flow(17, "10.96.0.10:80"),
            flow(6, "10.96.0.99:80"),
        ];
        name(&mut flows, views.iter());
        let names: Vec<Option<&str>> = flows.iter().map(|f| f.service.as_deref()).collect();
        assert_eq!(
            names,
            vec![
                Some("prod/web"),
                Some("prod/dns"),
                Some("prod/np"),
                None,
                None
            ]
        );
    }
}
