//! Cluster-wide identities on a real etcd: two agents (two node namespaces, each with its own pin root,
//! socket and state directory) reach one etcd in an infra namespace over veths. The same label set gets
//! the same number on both nodes, another label set another number; a label set no node uses any more is
//! released after `--identity-gc-grace` (read from etcd itself), while one still in use on both nodes is
//! kept the whole time and its number is never handed to another label set.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use hyper::Method;
use ipam::identity::IdentityAllocator;
use serde_json::Value;
use tests::{
    agent_pod::pod,
    agent_proc::{AgentDirs, AgentProcess},
    bpf::PinRoot,
    etcd_netns::{NetnsEtcd, PORT},
    netns::{NetNs, VethPair},
    privileged::require_root,
};

/// Identity number → label set, as etcd holds them (read from inside the infra namespace).
fn etcd_identities(infra: &NetNs) -> BTreeMap<u32, BTreeMap<String, String>> {
    tests::etcd_netns::with_store(infra, |store| async move {
        IdentityAllocator::new(store, "wt-reader", 256..=65_535, 3_600)
            .list()
            .await
            .expect("list identities")
            .into_iter()
            .map(|i| (i.id, i.labels))
            .collect()
    })
}

fn identity_of(agent: &AgentProcess, key: &str) -> u32 {
    let view: Value = agent
        .api(Method::GET, &format!("/v1/endpoints/{key}"), None)
        .expect("endpoint");
    u32::try_from(view["identity"].as_u64().expect("an identity")).expect("u32")
}

#[test]
fn two_nodes_agree_on_identities_and_unused_ones_are_released_after_the_grace_period() {
    if !require_root(
        "two_nodes_agree_on_identities_and_unused_ones_are_released_after_the_grace_period",
    ) {
        return;
    }
    let infra = NetNs::new();
    let (node_a, node_b) = (NetNs::new(), NetNs::new());
    let link_a = VethPair::new(&infra, "ia", &node_a, "na");
    let link_b = VethPair::new(&infra, "ib", &node_b, "nb");
    for (ns, dev, addr) in [
        (&infra, &link_a.a, "10.99.1.1/30"),
        (&node_a, &link_a.b, "10.99.1.2/30"),
        (&infra, &link_b.a, "10.99.2.1/30"),
        (&node_b, &link_b.b, "10.99.2.2/30"),
    ] {
        ns.exec(&["ip", "addr", "add", addr, "dev", dev]);
    }
    let _etcd = NetnsEtcd::start(&infra);

    let start = |node: &NetNs, name: &str, etcd_ip: &str| {
        let (root, dirs) = (PinRoot::new(), AgentDirs::new());
        let datastore = format!("etcd:http://{etcd_ip}:{PORT}");
        let agent = AgentProcess::start(
            &root,
            &dirs,
            Some(node),
            &[
                "--datastore",
                &datastore,
                "--node",
                name,
                "--identity-gc-grace",
                "4",
            ],
        );
        (root, dirs, agent)
    };
    let (_root_a, _dirs_a, agent_a) = start(&node_a, "wt-node-a", "10.99.1.1");
    let (_root_b, _dirs_b, agent_b) = start(&node_b, "wt-node-b", "10.99.2.1");

    // B sees db first and A sees web first: numbers allocated per node would differ (each node would give its
    // first label set the first number); cluster-wide they agree.
    let db_b = pod(&node_b, &agent_b, "wt-db-b", "db");
    let _web_a = pod(&node_a, &agent_a, "wt-web-a", "web");
    let _web_b = pod(&node_b, &agent_b, "wt-web-b", "web");
    let web = identity_of(&agent_a, "wt-web-a:eth0");
    assert_eq!(
        identity_of(&agent_b, "wt-web-b:eth0"),
        web,
        "one number for one label set on every node"
    );
    let db = identity_of(&agent_b, "wt-db-b:eth0");
    assert_ne!(db, web, "another label set, another number");
    let stored = etcd_identities(&infra);
    assert_eq!(
        stored
            .get(&web)
            .and_then(|l| l.get("app"))
            .map(String::as_str),
        Some("web")
    );
    assert_eq!(
        stored
            .get(&db)
            .and_then(|l| l.get("app"))
            .map(String::as_str),
        Some("db")
    );

    // db's only pod goes: db is released after the grace period (4 s; renewals every 1 s, collection every
    // 2 s), while web, in use on both nodes, stays the whole time.
    let _: Value = agent_b
        .api(Method::DELETE, "/v1/endpoints/wt-db-b:eth0", None)
        .expect("delete db");
    drop(db_b);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let stored = etcd_identities(&infra);
        assert!(
            stored.contains_key(&web),
            "web was released while both nodes use it"
        );
        if !stored.contains_key(&db) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "db was not released within 60 s: {stored:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // Past several grace periods, web is still there: renewals keep it.
    std::thread::sleep(Duration::from_secs(6));
    assert!(
        etcd_identities(&infra).contains_key(&web),
        "web expired although renewed"
    );
    // A new label set never gets a number in use.
    let _api_a = pod(&node_a, &agent_a, "wt-api-a", "api");
    let api = identity_of(&agent_a, "wt-api-a:eth0");
    assert_ne!(api, web, "a number in use was handed to another label set");
    assert_eq!(
        etcd_identities(&infra)
            .get(&api)
            .and_then(|l| l.get("app"))
            .map(String::as_str),
        Some("api")
    );
}
