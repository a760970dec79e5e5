//! Services and EndpointSlices through the policy directory's reader: what converts, and each
//! refusal naming the file, line and field.

use std::net::IpAddr;

use super::model::{SessionAffinity, TargetPort};
use crate::calc::policy::load::parse_str;

const SERVICE: &str = "kind: Service\nmetadata: {name: web, namespace: prod}\nspec:\n  clusterIP: 10.96.0.10\n  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}\n  ports:\n  - {name: http, port: 80, targetPort: web-http}\n  - {name: dns, protocol: UDP, port: 53, targetPort: 5353}\n  - {name: plain, port: 8080}\n";

const SLICE: &str = "kind: EndpointSlice\napiVersion: discovery.k8s.io/v1\nmetadata: {name: web-abc, namespace: prod, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nports: [{name: http, port: 8080}, {name: dns, protocol: UDP, port: 5353}]\nendpoints:\n- {addresses: [10.0.0.1], conditions: {ready: true}, nodeName: n1}\n- {addresses: [10.0.0.2], conditions: {ready: false, serving: true, terminating: true}}\n- {addresses: [10.0.0.3]}\n";

#[test]
fn a_service_and_its_slice_convert() {
    let set = parse_str("s.yaml", &format!("{SERVICE}---\n{SLICE}")).expect("valid");
    let s = &set.services[&("prod".to_owned(), "web".to_owned())];
    assert_eq!(
        s.cluster_ips,
        vec!["10.96.0.10".parse::<IpAddr>().expect("ip")]
    );
    assert_eq!(
        s.affinity,
        SessionAffinity::ClientIp {
            timeout_seconds: 60
        }
    );
    assert_eq!(s.ports.len(), 3);
    assert_eq!(s.ports[0].target, TargetPort::Named("web-http".into()));
    assert_eq!(
        (s.ports[1].protocol, s.ports[1].target.clone()),
        (17, TargetPort::Number(5353))
    );
    assert_eq!(
        s.ports[2].target,
        TargetPort::Number(8080),
        "absent: the port"
    );
    let slice = &set.endpoint_slices[&("prod".to_owned(), "web-abc".to_owned())];
    assert_eq!(slice.service, "web");
    assert_eq!(slice.ports[0].port, 8080);
    let ready: Vec<bool> = slice
        .endpoints
        .iter()
        .map(super::model::Endpoint::serves_new_flows)
        .collect();
    assert_eq!(ready, [true, false, true], "absent conditions: ready");
    assert!(slice.endpoints[1].serving && slice.endpoints[1].terminating);
    assert_eq!(slice.endpoints[0].node.as_deref(), Some("n1"));
}

#[test]
fn a_headless_service_has_no_frontend_and_affinity_defaults() {
    let set = parse_str(
        "h.yaml",
        "kind: Service\nmetadata: {name: h}\nspec: {clusterIP: None, sessionAffinity: ClientIP, ports: [{port: 80}]}\n",
    )
    .expect("valid");
    let s = &set.services[&("default".to_owned(), "h".to_owned())];
    assert!(s.cluster_ips.is_empty());
    assert_eq!(
        s.affinity,
        SessionAffinity::ClientIp {
            timeout_seconds: super::model::DEFAULT_AFFINITY_TIMEOUT_SECONDS
        }
    );
}

#[test]
fn external_ips_and_load_balancer_addresses_are_frontends() {
    let set = parse_str(
        "lb.yaml",
        "kind: Service\nmetadata: {name: lb, namespace: prod}\nspec:\n  type: LoadBalancer\n  clusterIP: 10.96.0.20\n  externalIPs: [192.0.2.10]\n  ports: [{port: 80, nodePort: 30080}]\nstatus:\n  loadBalancer:\n    ingress: [{ip: 198.51.100.7}, {hostname: lb.example.com}, {ip: 192.0.2.10}]\n---\nkind: Service\nmetadata: {name: plain, namespace: prod}\nspec:\n  clusterIP: 10.96.0.21\n  ports: [{port: 80}]\nstatus:\n  loadBalancer:\n    ingress: [{ip: 198.51.100.8}]\n",
    )
    .expect("valid");
    let ips = |name: &str| {
        set.services[&("prod".to_owned(), name.to_owned())]
            .external_ips
            .clone()
    };
    let want: Vec<IpAddr> = ["192.0.2.10", "198.51.100.7"]
        .iter()
        .map(|a| a.parse().expect("ip"))
        .collect();
    assert_eq!(
        ips("lb"),
        want,
        "externalIPs, then the load balancer's addresses (a hostname has none), once each"
    );
    assert!(
        ips("plain").is_empty(),
        "only a LoadBalancer Service's status counts"
    );
}

#[test]
fn bad_services_and_slices_name_file_line_and_field() {
    let cases = [
        (
            "kind: Service\nmetadata: {name: x}\nspec: {clusterIP: 10.96.0.300}\n",
            "spec.clusterIP",
        ),
        (
            "kind: Service\nmetadata: {name: x}\nspec: {clusterIPs: [10.96.0.1, 10.96.0.2]}\n",
            "spec.clusterIPs[1]",
        ),
        (
            "kind: Service\nmetadata: {name: x}\nspec: {ports: [{port: 0}]}\n",
            "spec.ports[0].port",
        ),
        (
            "kind: Service\nmetadata: {name: x}\nspec: {externalIPs: [192.0.2.1, 192.0.2.x]}\n",
            "spec.externalIPs[1]",
        ),
        (
            "kind: Service\nmetadata: {name: x}\nspec: {internalTrafficPolicy: Node}\n",
            "spec.internalTrafficPolicy",
        ),
        (
            "kind: Service\nmetadata: {name: x}\nspec: {type: LoadBalancer, ports: [{port: 80, nodePort: 30080}]}\nstatus: {loadBalancer: {ingress: [{ip: nope}]}}\n",
            "status.loadBalancer.ingress[0].ip",
        ),
        (
            "kind: Service\nmetadata: {name: x}\nspec: {ports: [{port: 80, protocol: ICMP}]}\n",
            "spec.ports[0].protocol",
        ),
        (
            "kind: Service\nmetadata: {name: x}\nspec: {ports: [{name: a, port: 80}, {port: 81}]}\n",
            "spec.ports[1].name",
        ),
        (
            "kind: Service\nmetadata: {name: x}\nspec: {ports: [{name: a, port: 80}, {name: a, port: 81}]}\n",
            "used twice",
        ),
        (
            "kind: Service\nmetadata: {name: x}\nspec: {ports: [{port: 80, targetPort: Bad_Name}]}\n",
            "spec.ports[0].targetPort",
        ),
        (
            "kind: Service\nmetadata: {name: x}\nspec: {sessionAffinity: Sticky}\n",
            "spec.sessionAffinity",
        ),
        (
            "kind: Service\nmetadata: {name: x}\nspec: {sessionAffinity: ClientIP, sessionAffinityConfig: {clientIP: {timeoutSeconds: 0}}}\n",
            "timeoutSeconds",
        ),
        (
            "kind: Service\nmetadata: {name: x}\nspec: {type: NodePort, ports: [{port: 80}]}\n",
            "spec.ports[0].nodePort is missing",
        ),
        (
            "kind: Service\nmetadata: {name: x}\nspec: {type: NodePort, ports: [{name: a, port: 80, nodePort: 30080}, {name: b, port: 81, nodePort: 30080}]}\n",
            "spec.ports[1].nodePort",
        ),
        (
            "kind: Service\nmetadata: {name: x}\nspec: {type: NodePort, ports: [{port: 80, nodePort: 70000}]}\n",
            "spec.ports[0].nodePort",
        ),
        (
            "kind: Service\nmetadata: {name: x}\nspec: {type: Gateway}\n",
            "spec.type",
        ),
        (
            "kind: Service\nmetadata: {name: x}\nspec: {type: NodePort, externalTrafficPolicy: Nearby, ports: [{port: 80, nodePort: 30080}]}\n",
            "spec.externalTrafficPolicy",
        ),
        (
            "kind: EndpointSlice\nmetadata: {name: x}\naddressType: IPv4\n",
            "kubernetes.io/service-name",
        ),
        (
            "kind: EndpointSlice\nmetadata: {name: x, labels: {kubernetes.io/service-name: s}}\naddressType: FQDN\n",
            "addressType",
        ),
        (
            "kind: EndpointSlice\nmetadata: {name: x, labels: {kubernetes.io/service-name: s}}\naddressType: IPv4\nendpoints: [{addresses: [fd00::1]}]\n",
            "endpoints[0].addresses[0]",
        ),
        (
            "kind: EndpointSlice\nmetadata: {name: x, labels: {kubernetes.io/service-name: s}}\naddressType: IPv4\nports: [{name: a}]\n",
            "ports[0].port",
        ),
    ];
    for (text, needle) in cases {
        let errors = parse_str(
            "bad.yaml",
            &format!("kind: Namespace\nmetadata: {{name: ok}}\n---\n{text}"),
        )
        .expect_err(needle);
        assert_eq!(errors.len(), 1, "{errors:?}");
        let message = errors[0].to_string();
        assert!(message.starts_with("bad.yaml:4: "), "{message}");
        assert!(
            message.contains(needle),
            "{message} does not mention {needle}"
        );
    }
}

#[test]
fn a_bad_service_keeps_its_last_good_form() {
    use crate::calc::policy::{last_good::merge, load::load_dir_full};
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("s.yaml");
    std::fs::write(&file, SERVICE).expect("write");
    let last = load_dir_full(dir.path());
    assert!(last.errors.is_empty(), "{:?}", last.errors);
    std::fs::write(&file, SERVICE.replace("port: 80,", "port: 0,")).expect("write");
    let now = load_dir_full(dir.path());
    assert_eq!(now.errors.len(), 1);
    let merged = merge(now, &last);
    let key = ("prod".to_owned(), "web".to_owned());
    assert_eq!(merged.set.services[&key], last.set.services[&key]);
}
