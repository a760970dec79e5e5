//! A synthetic node for the in-process tests and `cargo xtask bench policy`: endpoints spread
//! over namespaces, and NetworkPolicies whose selectors cover pod labels, namespace labels, ports
//! (single, ranges, TCP and UDP) and CIDRs with exceptions. Deterministic: the same sizes give the
//! same node. Written where the agent's sources read them (the registry file, the policy
//! directory), so the real sources load them.

use std::{collections::BTreeMap, net::IpAddr, path::Path};

use crate::{paths::Paths, sources::registry::Endpoint};

/// How big.
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    /// Endpoints.
    pub endpoints: usize,
    /// Namespaces (endpoint `i` lives in namespace `i % namespaces`).
    pub namespaces: usize,
    /// NetworkPolicies.
    pub policies: usize,
}

/// The host-side veth of endpoint `i` (a workload name: `weir` + 11 hex digits).
#[must_use]
pub fn host_ifname(i: usize) -> String {
    format!("weir{i:011x}")
}

/// The namespace of endpoint `i`.
#[must_use]
pub fn namespace(sizes: Sizes, i: usize) -> String {
    format!("ns{}", i % sizes.namespaces.max(1))
}

/// The pod labels of endpoint `i` (an `app`, a `tier` and a `ver`).
#[must_use]
pub fn labels(i: usize) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app".to_owned(), format!("a{}", i % 20)),
        ("tier".to_owned(), ["web", "db", "cache"][i % 3].to_owned()),
        ("ver".to_owned(), format!("v{}", i % 4)),
    ])
}

/// The address of endpoint `i` (10.100.0.0/14, one per endpoint).
#[must_use]
pub fn address(i: usize) -> IpAddr {
    let [_, b, c, d] = u32::try_from(i).unwrap_or(u32::MAX).to_be_bytes();
    IpAddr::from([10, 100 + (b & 3), c, d])
}

/// Endpoint `i` as the CNI registers it (id 0: the registry assigns it).
#[must_use]
pub fn endpoint(sizes: Sizes, i: usize) -> Endpoint {
    Endpoint {
        id: 0,
        container_id: format!("c{i}"),
        ifname: "eth0".to_owned(),
        host_ifname: host_ifname(i),
        netns: format!("/var/run/netns/p{i}"),
        namespace: namespace(sizes, i),
        pod: format!("p{i}"),
        labels: labels(i),
        handle: format!("h{i}"),
        ips: vec![address(i)],
    }
}

/// The registry file (`endpoints.json`) of endpoints `0..sizes.endpoints`, ids `1..`.
#[must_use]
pub fn registry_json(sizes: Sizes) -> serde_json::Value {
    let mut endpoints = serde_json::Map::new();
    for i in 0..sizes.endpoints {
        let mut e = endpoint(sizes, i);
        e.id = u32::try_from(i + 1).unwrap_or(u32::MAX);
        endpoints.insert(e.key(), serde_json::to_value(&e).unwrap_or_default());
    }
    serde_json::json!({"next_id": sizes.endpoints + 1, "endpoints": endpoints})
}

/// The namespace documents and policy `j`, as YAML.
#[must_use]
pub fn policies_yaml(sizes: Sizes) -> String {
    let mut out = String::new();
    for n in 0..sizes.namespaces {
        out.push_str(&format!(
            "---\nkind: Namespace\nmetadata: {{name: ns{n}, labels: {{team: t{}, env: {}}}}}\n",
            n % 5,
            ["prod", "dev"][n % 2]
        ));
    }
    for j in 0..sizes.policies {
        let ns = j % sizes.namespaces.max(1);
        let block = j % 250;
        out.push_str(&format!(
            "---\nkind: NetworkPolicy\nmetadata: {{name: pol{j}, namespace: ns{ns}}}\nspec:\n  podSelector: {{matchLabels: {{app: a{app}}}}}\n  ingress:\n  - from: [{{podSelector: {{matchLabels: {{tier: web}}}}}}]\n    ports: [{{port: {port}}}, {{protocol: UDP, port: 53}}]\n  - from: [{{namespaceSelector: {{matchLabels: {{team: t{team}}}}}, podSelector: {{matchLabels: {{ver: v{ver}}}}}}}]\n    ports: [{{{range}}}]\n  - from: [{{ipBlock: {{cidr: 10.200.{block}.0/24, except: [10.200.{block}.128/25]}}}}]\n",
            app = j % 20,
            // A port range for the first 100 only: the 5 policies selecting a pod would
            // otherwise put the same range 5 times into one entry's 4 range slots.
            range = if j < 100 {
                "port: 8000, endPort: 8100".to_owned()
            } else {
                format!("port: {}", 8000 + j / 100)
            },
            port = 80 + j % 10,
            team = j % 5,
            ver = j % 4,
        ));
        // Every tenth also isolates egress: to one team's namespaces on 443, and to a CIDR.
        if j % 10 == 0 {
            out.push_str(&format!(
                "  egress:\n  - to: [{{namespaceSelector: {{matchLabels: {{team: t{}}}}}}}]\n    ports: [{{port: 443}}]\n  - to: [{{ipBlock: {{cidr: 192.168.{}.0/24}}}}]\n",
                (j / 10) % 5,
                j % 200
            ));
        }
    }
    out
}

/// Writes the registry and the policy directory of `paths` (both created if missing).
pub fn write(paths: &Paths, sizes: Sizes) -> std::io::Result<()> {
    std::fs::create_dir_all(&paths.state_dir)?;
    std::fs::create_dir_all(&paths.policy_dir)?;
    write_policies(&paths.policy_dir, sizes)?;
    std::fs::write(
        paths.registry(),
        serde_json::to_vec(&registry_json(sizes)).map_err(std::io::Error::other)?,
    )
}

/// Writes only the policy directory.
pub fn write_policies(dir: &Path, sizes: Sizes) -> std::io::Result<()> {
    std::fs::write(dir.join("synthetic.yaml"), policies_yaml(sizes))
}
