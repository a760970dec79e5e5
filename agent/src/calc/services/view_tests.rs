//! The operators' view: every frontend with every endpoint of its family and that endpoint's state.

use super::view::{BackendState, views};
use crate::calc::policy::load::parse_str;

const DOCS: &str = "\
kind: Service
metadata: {name: web, namespace: prod}
spec:
  clusterIPs: [10.96.0.10, \"fd00:96::10\"]
  sessionAffinity: ClientIP
  ports: [{name: http, port: 80, targetPort: http}, {name: dns, port: 53, protocol: UDP}]
---
kind: Service
metadata: {name: headless, namespace: prod}
spec: {clusterIP: None, ports: [{port: 80}]}
---
kind: EndpointSlice
metadata: {name: web-v4, namespace: prod, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.0.0.3], conditions: {ready: true}, nodeName: n1}
- {addresses: [10.0.0.1], conditions: {ready: false, serving: true, terminating: true}}
- {addresses: [10.0.0.2], conditions: {ready: false}}
---
kind: EndpointSlice
metadata: {name: web-v6, namespace: prod, labels: {kubernetes.io/service-name: web}}
addressType: IPv6
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [\"fd00::1\"]}
---
kind: EndpointSlice
metadata: {name: other-1, namespace: prod, labels: {kubernetes.io/service-name: other}}
addressType: IPv4
ports: [{name: http, port: 9090}]
endpoints:
- {addresses: [10.0.9.9]}
";

#[test]
fn each_frontend_lists_its_familys_endpoints_with_their_state() {
    let set = parse_str("s.yaml", DOCS).expect("valid");
    let all = views(&set.services, &set.endpoint_slices);
    let fronts: Vec<(&str, &str)> = all
        .iter()
        .map(|v| (v.service.as_str(), v.frontend.as_str()))
        .collect();
    assert_eq!(
        fronts,
        [
            ("prod/web", "10.96.0.10:80/tcp"),
            ("prod/web", "10.96.0.10:53/udp"),
            ("prod/web", "[fd00:96::10]:80/tcp"),
            ("prod/web", "[fd00:96::10]:53/udp"),
        ],
        "a headless Service has no frontend; a slice alone makes none"
    );
    assert!(
        all.iter()
            .all(|v| v.affinity_timeout_seconds == Some(10_800))
    );
    let http4: Vec<(&str, BackendState, &str)> = all[0]
        .backends
        .iter()
        .map(|b| (b.address.as_str(), b.state, b.slice.as_str()))
        .collect();
    assert_eq!(
        http4,
        [
            ("10.0.0.1:8080", BackendState::Terminating, "web-v4"),
            ("10.0.0.2:8080", BackendState::NotReady, "web-v4"),
            ("10.0.0.3:8080", BackendState::Ready, "web-v4"),
        ],
        "sorted by address, another Service's slice left out"
    );
    assert_eq!(all[0].backends[2].node.as_deref(), Some("n1"));
    assert!(all[1].backends.is_empty(), "no slice has the dns port");
    let http6: Vec<String> = all[2]
        .backends
        .iter()
        .map(|b| format!("{} {}", b.address, b.state.name()))
        .collect();
    assert_eq!(http6, ["[fd00::1]:8080 ready"], "absent conditions: ready");
    let json = serde_json::to_value(&all[0]).expect("json");
    assert_eq!(json["backends"][0]["state"], "terminating");
    assert_eq!(json["backends"][1]["state"], "not-ready");
}
