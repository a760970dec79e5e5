//! The operators' view: every frontend with every endpoint of its family and that endpoint's state.

use super::view::{BackendState, views};
use crate::policy::load::parse_str;

const DOCS: &str = "\
kind: Service
metadata: {name: web, namespace: prod}
spec:
  clusterIPs: [10.96.0.10, \"fd00:96::10\"]
  sessionAffinity: ClientIP
  ports: [{name: http, port: 80, targetPort: http}, {name: dns, port: 53, protocol: UDP}]
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
    assert_eq!(all.len(), 1, "one Service (a slice alone makes none)");
    let web = &all[0];
    assert_eq!((web.namespace.as_str(), web.name.as_str()), ("prod", "web"));
    assert_eq!(web.affinity_timeout_seconds, Some(10_800));
    let fronts: Vec<String> = web
        .frontends
        .iter()
        .map(|f| format!("{}:{}/{}", f.ip, f.port, f.protocol))
        .collect();
    assert_eq!(
        fronts,
        [
            "10.96.0.10:80/TCP",
            "10.96.0.10:53/UDP",
            "fd00:96::10:80/TCP",
            "fd00:96::10:53/UDP"
        ]
    );
    let http4: Vec<(String, u16, BackendState, &str)> = web.frontends[0]
        .backends
        .iter()
        .map(|b| (b.ip.to_string(), b.port, b.state, b.slice.as_str()))
        .collect();
    assert_eq!(
        http4,
        [
            ("10.0.0.1".into(), 8080, BackendState::Terminating, "web-v4"),
            ("10.0.0.2".into(), 8080, BackendState::NotReady, "web-v4"),
            ("10.0.0.3".into(), 8080, BackendState::Ready, "web-v4"),
        ],
        "sorted by address, another Service's slice left out"
    );
    assert_eq!(web.frontends[0].backends[2].node.as_deref(), Some("n1"));
    assert!(
        web.frontends[1].backends.is_empty(),
        "no slice has the dns port"
    );
    let http6: Vec<String> = web.frontends[2]
        .backends
        .iter()
        .map(|b| format!("{} {}", b.ip, b.state.name()))
        .collect();
    assert_eq!(http6, ["fd00::1 ready"], "absent conditions: ready");
    let json = serde_json::to_value(web).expect("json");
    assert_eq!(json["frontends"][0]["backends"][0]["state"], "terminating");
    assert_eq!(json["frontends"][0]["backends"][1]["state"], "not-ready");
}
