use super::*;
use crate::calc::policy::load::parse_str;

fn pool(name: &str, cidr: &str) -> IpPool {
    IpPool {
        name: name.to_owned(),
        cidr: cidr.parse().expect("cidr"),
        block_size: 26,
        node_selector: String::new(),
        namespace_selector: String::new(),
        allowed_uses: IpPool::default_allowed_uses(),
        disabled: false,
    }
}

fn pools() -> Vec<IpPool> {
    vec![
        pool("default-ipv4", "10.244.0.0/16"),
        pool("blue", "10.77.0.0/24"),
        pool("red", "10.78.0.0/24"),
        pool("default-ipv6", "fd00:1::/64"),
        pool("blue6", "fd00:77::/64"),
    ]
}

/// The hints of one directory's documents: namespace `tenant` (annotated `ns`), and pod
/// `tenant/web` (annotated `pod`).
fn hints(ns: &str, pod: &str) -> PodHints {
    let text = format!(
        "kind: Namespace\nmetadata:\n  name: tenant\n  annotations: {{{ns}}}\n---\n\
         kind: Pod\nmetadata:\n  name: web\n  namespace: tenant\n  annotations: {{{pod}}}\n\
         spec: {{containers: [{{name: main}}]}}\n"
    );
    let set = parse_str("t.yaml", &text).expect("valid documents");
    IpamHints::of(&set).for_pod("tenant", "web")
}

fn request(ipv4: u32, ipv6: u32, pools: &[&str]) -> AllocateRequest {
    AllocateRequest {
        handle: "net.c1".to_owned(),
        ipv4,
        ipv6,
        pools: pools.iter().map(|p| (*p).to_owned()).collect(),
        namespace: "tenant".to_owned(),
        pod: "web".to_owned(),
        ..AllocateRequest::default()
    }
}

fn applied(h: &PodHints, req: &AllocateRequest) -> Result<AllocateRequest, AnnotationError> {
    apply(req, &h.wanted()?, &pools(), &BTreeMap::new())
}

#[test]
fn the_pod_annotation_wins_over_the_namespace_which_wins_over_the_cni_config() {
    let req = request(1, 0, &["default-ipv4"]);
    // Positive control: no annotation, the CNI config's pools.
    assert_eq!(
        applied(&hints("", ""), &req).expect("plain").pools,
        ["default-ipv4"]
    );
    let ns = r#"weir.dev/ipv4pools: '["blue"]'"#;
    assert_eq!(applied(&hints(ns, ""), &req).expect("ns").pools, ["blue"]);
    let pod = r#"weir.dev/ipv4pools: '["red"]'"#;
    assert_eq!(applied(&hints(ns, pod), &req).expect("pod").pools, ["red"]);
    // A CIDR names the pool with that CIDR.
    let by_cidr = r#"weir.dev/ipv4pools: '["10.78.0.0/24"]'"#;
    assert_eq!(
        applied(&hints(ns, by_cidr), &req).expect("cidr").pools,
        ["red"]
    );
    // An empty list asks for nothing: the namespace's decides.
    assert_eq!(
        applied(&hints(ns, r"weir.dev/ipv4pools: '[]'"), &req)
            .expect("empty")
            .pools,
        ["blue"]
    );
    // Other annotations, and other prefixes, change nothing.
    assert_eq!(
        applied(
            &hints(
                "",
                "weir.dev/other: x, cni.projectcalico.org/ipv4pools: '[\"red\"]'"
            ),
            &req
        )
        .expect("other")
        .pools,
        ["default-ipv4"]
    );
}

#[test]
fn each_family_takes_its_own_annotation_and_keeps_the_other_familys_fallback() {
    let ns = r#"weir.dev/ipv6pools: '["blue6"]'"#;
    // Dual-stack, CNI config pools for both: IPv4 keeps the config's IPv4 pool, IPv6 the annotation's.
    let req = request(1, 1, &["default-ipv4", "default-ipv6"]);
    assert_eq!(
        applied(&hints(ns, ""), &req).expect("dual").pools,
        ["default-ipv4", "blue6"]
    );
    // No config pools: the unannotated family gets every enabled pool of its family (the library's
    // own choice without a list), computed from the pool list.
    let req = request(1, 1, &[]);
    let expected: Vec<String> = pools()
        .iter()
        .filter(|p| p.cidr.is_ipv4())
        .map(|p| p.name.clone())
        .chain(["blue6".to_owned()])
        .collect();
    assert_eq!(applied(&hints(ns, ""), &req).expect("dual").pools, expected);
    // A family not asked for ignores its annotation.
    assert_eq!(
        applied(&hints(ns, ""), &request(1, 0, &[]))
            .expect("v4")
            .pools,
        expected[..3]
    );
}

#[test]
fn requested_addresses_come_from_the_pod_only_and_replace_the_counts() {
    let pod = r#"weir.dev/ipAddrs: '["10.77.0.9", "fd00:77::9"]'"#;
    let out = applied(
        &hints(r#"weir.dev/ipv4pools: '["red"]'"#, pod),
        &request(1, 0, &["default-ipv4"]),
    )
    .expect("ips");
    assert_eq!(
        out.ips,
        [
            "10.77.0.9".parse::<IpAddr>().expect("ip"),
            "fd00:77::9".parse().expect("ip")
        ]
    );
    assert_eq!((out.ipv4, out.ipv6), (0, 0));
    assert!(out.pools.is_empty(), "the namespace's pools do not apply");
    // On the namespace it means nothing.
    let ns_only = hints(r#"weir.dev/ipAddrs: '["10.77.0.9"]'"#, "")
        .wanted()
        .expect("ns");
    assert!(ns_only.is_empty(), "{ns_only:?}");
}

#[track_caller]
fn refused(ns: &str, pod: &str, req: &AllocateRequest, needles: &[&str]) {
    let message = applied(&hints(ns, pod), req)
        .expect_err("refused")
        .to_string();
    for needle in needles {
        assert!(
            message.contains(needle),
            "{message:?} does not mention {needle:?}"
        );
    }
}

#[test]
fn a_bad_annotation_is_refused_naming_it_and_its_object() {
    let req = request(1, 0, &[]);
    refused(
        r#"weir.dev/ipv4pools: '["nosuch"]'"#,
        "",
        &req,
        &[
            "weir.dev/ipv4pools",
            "namespace tenant",
            "\"nosuch\"",
            "does not exist",
            "blue 10.77.0.0/24",
        ],
    );
    refused(
        "",
        r#"weir.dev/ipv4pools: '["blue6"]'"#,
        &req,
        &["weir.dev/ipv4pools", "pod tenant/web", "blue6", "not IPv4"],
    );
    refused(
        "",
        "weir.dev/ipv4pools: blue",
        &req,
        &["weir.dev/ipv4pools", "pod tenant/web", "JSON list"],
    );
    refused(
        "",
        r#"weir.dev/ipAddrs: '["10.77.0.300"]'"#,
        &req,
        &[
            "weir.dev/ipAddrs",
            "pod tenant/web",
            "10.77.0.300",
            "not an IP address",
        ],
    );
    refused(
        "",
        r#"weir.dev/ipAddrs: '["10.77.0.9"]', weir.dev/ipv4pools: '["blue"]'"#,
        &req,
        &["weir.dev/ipAddrs", "weir.dev/ipv4pools", "remove one"],
    );
    let mut with_cni_ips = req.clone();
    with_cni_ips.ips = vec!["10.77.0.8".parse().expect("ip")];
    refused(
        "",
        r#"weir.dev/ipAddrs: '["10.77.0.9"]'"#,
        &with_cni_ips,
        &["weir.dev/ipAddrs", "CNI_ARGS"],
    );
}

#[test]
fn hints_keep_only_the_ipam_annotations_of_pods_and_namespaces_that_have_them() {
    let text = "kind: Namespace\nmetadata: {name: plain, annotations: {weir.dev/other: x}}\n---\n\
                kind: Pod\nmetadata: {name: p, namespace: plain}\n\
                spec: {containers: [{name: main}]}\n";
    let set = parse_str("t.yaml", text).expect("valid");
    let hints = IpamHints::of(&set);
    assert!(hints.knows_pod("plain", "p"), "the pod is known");
    assert!(
        !hints.knows_pod("plain", "q"),
        "only the pods of the set are known"
    );
    assert!(
        IpamHints::of(&set)
            .for_pod("plain", "p")
            .wanted()
            .expect("none")
            .is_empty()
    );
}
