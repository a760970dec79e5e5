//! kube-proxy's rule layouts for `services` UDP Services, as kube-proxy writes them (names
//! shortened to the same lengths, comments kept): the measured Service at `measured` (its one
//! endpoint `backend:TARGET`), every other one with two endpoints no pod has.
//! - iptables mode (`iptables-restore` input, nat table): `KUBE-SERVICES` matches each ClusterIP
//!   in turn and jumps to the Service's `KUBE-SVC-*` chain, which picks an endpoint with
//!   `statistic --mode random` and jumps to its `KUBE-SEP-*` chain (masquerade mark for hairpin,
//!   DNAT);
//! - nftables mode (`nft -f` input, table `ip kube-proxy`): one verdict map keyed by
//!   `ipv4_addr . inet_proto . inet_service` to the Service's chain, `numgen random` over its
//!   endpoint chains, `dnat`.

use std::{fmt::Write as _, net::Ipv4Addr};

use crate::{PORT, TARGET, filler_backend, vip};

/// The pods' CIDR (traffic from outside it is marked for masquerade).
const CLUSTER_CIDR: &str = "10.249.0.0/16";

/// Service `i`'s ClusterIP and endpoints.
fn service(i: u32, measured: u32, backend: Ipv4Addr) -> (Ipv4Addr, Vec<Ipv4Addr>) {
    if i == measured {
        (vip(i), vec![backend])
    } else {
        (vip(i), vec![filler_backend(i, 0), filler_backend(i, 1)])
    }
}

/// kube-proxy's iptables-mode nat table.
#[must_use]
pub fn iptables(services: u32, measured: u32, backend: Ipv4Addr) -> String {
    let mut chains = String::new();
    let mut rules = String::new();
    for c in [
        "KUBE-SERVICES",
        "KUBE-POSTROUTING",
        "KUBE-MARK-MASQ",
        "KUBE-NODEPORTS",
    ] {
        let _ = writeln!(chains, ":{c} - [0:0]");
    }
    rules.push_str(
        "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n\
         -A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n\
         -A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n\
         -A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0\n\
         -A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully\n",
    );
    let mut per_service = String::new();
    for i in 0..services {
        let (ip, endpoints) = service(i, measured, backend);
        let name = format!("bench/svc-{i}:udp");
        let svc = format!("KUBE-SVC-{i:016X}");
        let _ = writeln!(chains, ":{svc} - [0:0]");
        let _ = writeln!(
            rules,
            "-A KUBE-SERVICES -d {ip}/32 -p udp -m comment --comment \"{name} cluster IP\" -m udp --dport {PORT} -j {svc}"
        );
        let _ = writeln!(
            per_service,
            "-A {svc} ! -s {CLUSTER_CIDR} -d {ip}/32 -p udp -m comment --comment \"{name} cluster IP\" -m udp --dport {PORT} -j KUBE-MARK-MASQ"
        );
        let n = endpoints.len();
        for (k, ep) in endpoints.iter().enumerate() {
            let sep = format!("KUBE-SEP-{i:08X}{k:08X}");
            let _ = writeln!(chains, ":{sep} - [0:0]");
            let comment = format!("-m comment --comment \"{name} -> {ep}:{TARGET}\"");
            if k + 1 < n {
                let p = 1.0 / (n - k) as f64;
                let _ = writeln!(
                    per_service,
                    "-A {svc} {comment} -m statistic --mode random --probability {p:.11} -j {sep}"
                );
            } else {
                let _ = writeln!(per_service, "-A {svc} {comment} -j {sep}");
            }
            let _ = writeln!(
                per_service,
                "-A {sep} -s {ep}/32 -m comment --comment {name} -j KUBE-MARK-MASQ\n\
                 -A {sep} -p udp -m comment --comment {name} -m udp -j DNAT --to-destination {ep}:{TARGET}"
            );
        }
    }
    rules.push_str(
        "-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n",
    );
    format!(
        "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n{chains}{rules}{per_service}COMMIT\n"
    )
}

/// kube-proxy's nftables-mode table, as the flat `add …` commands it sends (every chain and the
/// map declared before the rules and elements that name them).
#[must_use]
pub fn nft(services: u32, measured: u32, backend: Ipv4Addr) -> String {
    const T: &str = "ip kube-proxy";
    let mut decl = format!(
        "add table {T}\n\
         add chain {T} mark-for-masquerade\n\
         add chain {T} masquerading\n\
         add chain {T} services\n\
         add chain {T} nat-prerouting {{ type nat hook prerouting priority dstnat; policy accept; }}\n\
         add chain {T} nat-output {{ type nat hook output priority -100; policy accept; }}\n\
         add chain {T} nat-postrouting {{ type nat hook postrouting priority srcnat; policy accept; }}\n\
         add map {T} service-ips {{ type ipv4_addr . inet_proto . inet_service : verdict ; }}\n"
    );
    let mut rules = format!(
        "add rule {T} mark-for-masquerade meta mark set meta mark or 0x4000\n\
         add rule {T} masquerading meta mark & 0x4000 == 0 return\n\
         add rule {T} masquerading meta mark set meta mark xor 0x4000\n\
         add rule {T} masquerading masquerade fully-random\n\
         add rule {T} nat-prerouting jump services\n\
         add rule {T} nat-output jump services\n\
         add rule {T} nat-postrouting jump masquerading\n\
         add rule {T} services ip daddr . meta l4proto . th dport vmap @service-ips\n"
    );
    for i in 0..services {
        let (ip, endpoints) = service(i, measured, backend);
        let svc = format!("service-{i:08X}-bench/svc-{i}/udp/p");
        let _ = writeln!(decl, "add chain {T} {svc}");
        let mut arms = Vec::new();
        for (k, ep) in endpoints.iter().enumerate() {
            let chain = format!("endpoint-{i:08X}{k:04X}-bench/svc-{i}/udp/p__{ep}/{TARGET}");
            let _ = writeln!(decl, "add chain {T} {chain}");
            arms.push(format!("{k} : goto {chain}"));
            let _ = writeln!(
                rules,
                "add rule {T} {chain} ip saddr {ep} jump mark-for-masquerade\n\
                 add rule {T} {chain} meta l4proto udp dnat to {ep}:{TARGET}"
            );
        }
        let _ = writeln!(
            rules,
            "add rule {T} {svc} ip daddr {ip} udp dport {PORT} ip saddr != {CLUSTER_CIDR} jump mark-for-masquerade\n\
             add rule {T} {svc} numgen random mod {} vmap {{ {} }}\n\
             add element {T} service-ips {{ {ip} . udp . {PORT} : goto {svc} }}",
            endpoints.len(),
            arms.join(" , ")
        );
    }
    decl + &rules
}
