//! The acceptance scenarios of the IPAM reference (§4), adapted to weir's API, on the in-memory store.

use std::{collections::BTreeSet, net::IpAddr};

use ipam::{
    AssignArgs, Ipam, IpamError,
    model::{AffinityState, BlockError, IpPool, IpUse, IpamConfig, ReleaseCheck, Reservation},
    store::{Store, memory::MemoryStore},
};

fn pool(name: &str, cidr: &str, bs: u8) -> IpPool {
    IpPool {
        name: name.into(),
        cidr: cidr.parse().expect("test cidr"),
        block_size: bs,
        node_selector: String::new(),
        namespace_selector: String::new(),
        allowed_uses: vec![IpUse::Workload, IpUse::Tunnel],
        disabled: false,
    }
}

async fn mem_with(pools: &[IpPool]) -> Ipam<MemoryStore> {
    let ipam = Ipam::new(MemoryStore::new());
    for p in pools {
        ipam.add_pool(p.clone()).await.expect("add pool");
    }
    ipam
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("test ip")
}

fn plain(ips: &[IpAddr]) -> Vec<(IpAddr, ReleaseCheck)> {
    ips.iter().map(|i| (*i, ReleaseCheck::default())).collect()
}

async fn assert_consistent<S: Store + Clone>(ipam: &Ipam<S>) {
    let r = ipam.check().await.expect("check runs");
    assert!(r.ok(), "invariants broken: {:#?}", r.problems);
}

async fn strict(ipam: &Ipam<MemoryStore>, max: u32) {
    let c = IpamConfig {
        strict_affinity: true,
        max_blocks_per_host: max,
        ..IpamConfig::default()
    };
    ipam.set_config(c).await.expect("config");
}

#[tokio::test]
async fn dual_stack_pools_fill_completely_then_report_exhaustion() {
    let ipam = mem_with(&[
        pool("v4", "192.168.1.0/24", 26),
        pool("v6", "fd80:24e2:f998:72d6::/120", 122),
    ])
    .await;
    let r = ipam
        .auto_assign(&AssignArgs::new("host-a", "h1", 256, 256))
        .await
        .expect("assign");
    assert_eq!((r.ipv4.len(), r.ipv6.len()), (256, 256));
    assert!(r.messages.is_empty(), "{:?}", r.messages);
    assert_eq!(r.ips().into_iter().collect::<BTreeSet<_>>().len(), 512);
    assert!(
        r.ipv4.iter().all(|n| n.prefix() == 26),
        "addresses carry the block mask"
    );
    let more = ipam
        .auto_assign(&AssignArgs::new("host-a", "h2", 1, 0))
        .await
        .expect("assign");
    assert!(more.ipv4.is_empty());
    assert_eq!(
        more.messages,
        vec!["no IPs available in pools: [192.168.1.0/24]".to_owned()]
    );
    let args = AssignArgs::new("host-a", "h2", 1, 0);
    assert!(
        more.partial_fulfilment(&args)
            .expect("partial")
            .contains("assigned 0 of 1 requested ipv4")
    );
    assert_consistent(&ipam).await;
}

#[tokio::test]
async fn asking_for_one_more_than_the_pool_holds_is_partial_not_an_error() {
    let ipam = mem_with(&[pool("v4", "192.168.1.0/24", 26)]).await;
    let r = ipam
        .auto_assign(&AssignArgs::new("host-a", "h", 257, 0))
        .await
        .expect("assign");
    assert_eq!(r.ipv4.len(), 256);
    assert_eq!(
        r.messages,
        vec!["no IPs available in pools: [192.168.1.0/24]".to_owned()]
    );
}

#[tokio::test]
async fn max_blocks_per_host_caps_claims() {
    for (limit, expect) in [(1u32, 64usize), (2, 128)] {
        let ipam = mem_with(&[pool("v4", "192.168.1.0/24", 26)]).await;
        strict(&ipam, limit).await;
        let r = ipam
            .auto_assign(&AssignArgs::new("host-a", "h", 256, 0))
            .await
            .expect("assign");
        assert_eq!(r.ipv4.len(), expect);
        assert!(
            r.messages[0].contains(&format!("limit of {limit} blocks reached for this node")),
            "{:?}",
            r.messages
        );
    }
}

#[tokio::test]
async fn per_request_and_global_block_limits_stricter_wins() {
    let ipam = mem_with(&[pool("p", "10.0.0.0/28", 30)]).await;
    strict(&ipam, 2).await;
    for i in 0..8 {
        let r = ipam
            .auto_assign(&AssignArgs::new("host1", &format!("h{i}"), 1, 0))
            .await
            .expect("assign");
        assert_eq!(r.ipv4.len(), 1, "assign {i}");
    }
    let ninth = ipam
        .auto_assign(&AssignArgs::new("host1", "h9", 1, 0))
        .await
        .expect("assign");
    assert!(ninth.ipv4.is_empty() && ninth.messages[0].contains("limit of 2 blocks"));
    assert_eq!(
        ipam.auto_assign(&AssignArgs::new("host2", "x", 1, 0))
            .await
            .expect("assign")
            .ipv4
            .len(),
        1
    );
    assert!(
        ipam.auto_assign(&AssignArgs::new("host1", "h9", 1, 0))
            .await
            .expect("assign")
            .ipv4
            .is_empty()
    );
    let mut req = AssignArgs::new("host1", "h9", 1, 0);
    req.max_blocks = 3;
    assert!(
        ipam.auto_assign(&req)
            .await
            .expect("assign")
            .ipv4
            .is_empty(),
        "the global limit of 2 still wins"
    );
    strict(&ipam, 3).await;
    req.max_blocks = 2;
    assert!(
        ipam.auto_assign(&req)
            .await
            .expect("assign")
            .ipv4
            .is_empty(),
        "the request's limit of 2 wins"
    );
    req.max_blocks = 0;
    assert_eq!(
        ipam.auto_assign(&req).await.expect("assign").ipv4.len(),
        1,
        "a third block is allowed"
    );
    assert_consistent(&ipam).await;
}

#[tokio::test]
async fn a_host_borrows_from_another_hosts_block_without_strict_affinity() {
    let ipam = mem_with(&[pool("p", "10.0.0.0/25", 26)]).await;
    let a = ipam
        .auto_assign(&AssignArgs::new("host-a", "a1", 1, 0))
        .await
        .expect("a");
    let b = ipam
        .auto_assign(&AssignArgs::new("host-b", "b1", 1, 0))
        .await
        .expect("b");
    let (a_ip, b_ip) = (a.ipv4[0], b.ipv4[0]);
    assert_ne!(a_ip.network(), b_ip.network(), "hosts get different blocks");
    let many = ipam
        .auto_assign(&AssignArgs::new("host-a", "a2", 64, 0))
        .await
        .expect("a");
    assert_eq!(many.ipv4.len(), 64);
    let borrowed = many
        .ipv4
        .iter()
        .filter(|n| n.network() == b_ip.network())
        .count();
    assert_eq!(borrowed, 1, "63 from its own block and 1 borrowed");
    assert_consistent(&ipam).await;
}

#[tokio::test]
async fn strict_affinity_stops_at_affine_blocks() {
    let ipam = mem_with(&[
        pool("p1", "192.168.1.0/26", 26),
        pool("p2", "192.168.1.64/26", 26),
    ])
    .await;
    strict(&ipam, 0).await;
    let mut args = AssignArgs::new("host", "h", 256, 0);
    args.pools = vec!["p1".into()];
    let r = ipam.auto_assign(&args).await.expect("assign");
    assert_eq!(r.ipv4.len(), 64);
    assert_eq!(
        r.messages,
        vec!["no more free affine blocks and strict affinity enabled".to_owned()]
    );
}

#[tokio::test]
async fn strict_affinity_toggle_controls_borrowing() {
    let ipam = mem_with(&[pool("p", "10.0.0.0/28", 28)]).await;
    let one = |h: &str, n: &str| AssignArgs::new(h, n, 1, 0);
    assert_eq!(
        ipam.auto_assign(&one("host1", "a"))
            .await
            .expect("1")
            .ipv4
            .len(),
        1
    );
    assert_eq!(
        ipam.auto_assign(&one("host2", "b"))
            .await
            .expect("2")
            .ipv4
            .len(),
        1,
        "host2 borrows"
    );
    strict(&ipam, 0).await;
    assert_eq!(
        ipam.auto_assign(&one("host1", "c"))
            .await
            .expect("1")
            .ipv4
            .len(),
        1
    );
    assert_eq!(
        ipam.auto_assign(&one("host2", "d"))
            .await
            .expect("2")
            .ipv4
            .len(),
        0,
        "no borrowing"
    );
    ipam.set_config(IpamConfig::default())
        .await
        .expect("config");
    assert_eq!(
        ipam.auto_assign(&one("host2", "e"))
            .await
            .expect("2")
            .ipv4
            .len(),
        1
    );
    assert_consistent(&ipam).await;
}

#[tokio::test]
async fn allowed_uses_filter_pools() {
    let mut tunnel = pool("tun", "192.168.3.0/24", 32);
    tunnel.allowed_uses = vec![IpUse::Tunnel];
    let mut wl = pool("wl", "192.168.2.0/24", 32);
    wl.allowed_uses = vec![IpUse::Workload];
    let ipam = mem_with(&[wl, tunnel]).await;
    let mut args = AssignArgs::new("h", "x", 1, 0);
    args.pools = vec!["tun".into()];
    assert!(matches!(
        ipam.auto_assign(&args).await,
        Err(IpamError::NoQualifiedPool { .. })
    ));
    args.pools.clear();
    assert_eq!(
        ipam.auto_assign(&args).await.expect("workload").ipv4.len(),
        1
    );
    args.pools = vec!["tun".into()];
    args.intended_use = IpUse::Tunnel;
    let r = ipam.auto_assign(&args).await.expect("tunnel");
    assert!(r.ipv4[0].network().to_string().starts_with("192.168.3."));
}

#[tokio::test]
async fn requested_pools_must_exist_and_be_enabled() {
    let mut off = pool("p30", "30.0.0.0/24", 26);
    off.disabled = true;
    let ipam = mem_with(&[
        pool("p10", "10.0.0.0/24", 26),
        pool("p20", "20.0.0.0/24", 26),
        off,
    ])
    .await;
    let mut args = AssignArgs::new("h", "x", 1, 0);
    args.pools = vec!["p10".into(), "p30".into()];
    assert!(matches!(
        ipam.auto_assign(&args).await,
        Err(IpamError::PoolDisabled { .. })
    ));
    args.pools = vec!["p10".into(), "p40".into()];
    let e = ipam.auto_assign(&args).await.expect_err("missing pool");
    assert!(e.to_string().contains("\"p40\" does not exist"), "{e}");
    args.pools = vec!["p10".into(), "p20".into()];
    let r = ipam.auto_assign(&args).await.expect("assign");
    assert!(r.ipv4[0].ip().to_string().starts_with("10.0.0."));
    args.num_v4 = 300;
    assert_eq!(ipam.auto_assign(&args).await.expect("300").ipv4.len(), 300);
    let rest = ipam.auto_assign(&args).await.expect("rest");
    assert_eq!(rest.ipv4.len(), 211, "512 - 301");
    assert!(rest.messages[0].contains("10.0.0.0/24") && rest.messages[0].contains("20.0.0.0/24"));
    assert_consistent(&ipam).await;
}

#[tokio::test]
async fn node_selectors_pick_pools() {
    let mut p1 = pool("p1", "10.0.0.0/24", 26);
    p1.node_selector = "foo == \"bar\"".into();
    let mut p2 = pool("p2", "20.0.0.0/24", 26);
    p2.node_selector = "foo != \"bar\"".into();
    let ipam = mem_with(&[p1, p2]).await;
    let mut args = AssignArgs::new("h", "x", 300, 0);
    args.node_labels.insert("foo".into(), "bar".into());
    let r = ipam.auto_assign(&args).await.expect("assign");
    assert_eq!(r.ipv4.len(), 256);
    assert!(
        r.ipv4
            .iter()
            .all(|n| n.ip().to_string().starts_with("10.0.0."))
    );
}

#[tokio::test]
async fn reservations_are_never_handed_out() {
    let ipam = mem_with(&[pool("p", "10.0.0.0/26", 26)]).await;
    let cidrs = ["10.0.0.1/32", "10.0.0.32/30", "11.0.0.0/30", "10.0.0.17/32"];
    ipam.put_reservation(Reservation {
        name: "r".into(),
        reserved_cidrs: cidrs.iter().map(|c| c.parse().expect("c")).collect(),
    })
    .await
    .expect("reserve");
    let r = ipam
        .auto_assign(&AssignArgs::new("h", "x", 64, 0))
        .await
        .expect("assign");
    assert_eq!(r.ipv4.len(), 58);
    assert!(!r.ips().contains(&ip("10.0.0.1")) && !r.ips().contains(&ip("10.0.0.33")));
}

#[tokio::test]
async fn fifo_hands_out_the_longest_free_address_first() {
    let ipam = mem_with(&[pool("p", "10.0.0.0/24", 30)]).await;
    let mut seen = Vec::new();
    for i in 0..5 {
        let r = ipam
            .auto_assign(&AssignArgs::new("h", &format!("c{i}"), 1, 0))
            .await
            .expect("assign");
        let a = r.ips()[0];
        seen.push(a);
        let rel = ipam.release_ips(&plain(&[a])).await.expect("release");
        assert_eq!(rel.released.len(), 1);
    }
    assert_eq!(seen[..4].iter().collect::<BTreeSet<_>>().len(), 4);
    assert_eq!(
        seen[4], seen[0],
        "the fifth allocation reuses the first address"
    );
}

#[tokio::test]
async fn cooldown_delays_reuse() {
    let ipam = mem_with(&[pool("p", "10.0.0.0/30", 30)]).await;
    ipam.set_config(IpamConfig {
        ip_cooldown_seconds: 60,
        ..IpamConfig::default()
    })
    .await
    .expect("config");
    let all = ipam
        .auto_assign(&AssignArgs::new("h", "a", 4, 0))
        .await
        .expect("assign");
    ipam.release_ips(&plain(&all.ips()[..1]))
        .await
        .expect("release");
    assert!(
        ipam.auto_assign(&AssignArgs::new("h", "b", 1, 0))
            .await
            .expect("assign")
            .ipv4
            .is_empty()
    );
    ipam.clock().advance(61);
    assert_eq!(
        ipam.auto_assign(&AssignArgs::new("h", "b", 1, 0))
            .await
            .expect("assign")
            .ips(),
        all.ips()[..1].to_vec()
    );
    assert_consistent(&ipam).await;
}

#[tokio::test]
async fn an_empty_block_is_reclaimed_only_after_a_minute() {
    let ipam = mem_with(&[pool("p", "10.0.0.0/26", 26)]).await;
    strict(&ipam, 0).await;
    let a = ipam
        .auto_assign(&AssignArgs::new("hostA", "a", 1, 0))
        .await
        .expect("a");
    assert_eq!(a.ipv4.len(), 1);
    assert!(
        ipam.auto_assign(&AssignArgs::new("hostB", "b", 1, 0))
            .await
            .expect("b")
            .ipv4
            .is_empty()
    );
    ipam.release_ips(&plain(&a.ips())).await.expect("release");
    assert!(
        ipam.auto_assign(&AssignArgs::new("hostB", "b", 1, 0))
            .await
            .expect("b")
            .ipv4
            .is_empty(),
        "too young"
    );
    ipam.clock().advance(61);
    assert_eq!(
        ipam.auto_assign(&AssignArgs::new("hostB", "b", 1, 0))
            .await
            .expect("b")
            .ipv4
            .len(),
        1
    );
    assert!(
        ipam.host_affinities("hostA")
            .await
            .expect("affs")
            .is_empty()
    );
    assert_consistent(&ipam).await;
}

#[tokio::test]
async fn thirty_two_hosts_share_sixteen_blocks() {
    let ipam = mem_with(&[pool("p", "10.0.0.0/22", 26)]).await;
    let mut tasks = Vec::new();
    for h in 0..32 {
        let ipam = ipam.clone();
        tasks.push(tokio::spawn(async move {
            ipam.auto_assign(&AssignArgs::new(
                &format!("host{h}"),
                &format!("c{h}"),
                1,
                0,
            ))
            .await
        }));
    }
    let mut all = BTreeSet::new();
    for t in tasks {
        let r = t.await.expect("join").expect("assign");
        assert_eq!(r.ipv4.len(), 1);
        all.insert(r.ipv4[0].ip());
    }
    assert_eq!(all.len(), 32);
    let mut confirmed = 0;
    for h in 0..32 {
        for a in ipam
            .host_affinities(&format!("host{h}"))
            .await
            .expect("affs")
        {
            assert_eq!(a.state, AffinityState::Confirmed);
            confirmed += 1;
        }
    }
    assert_eq!(confirmed, 16);
    assert_consistent(&ipam).await;
}

#[tokio::test]
async fn concurrent_claims_on_one_host_all_succeed() {
    let ipam = mem_with(&[pool("p", "10.0.0.0/22", 26)]).await;
    let cidr: ipnetwork::IpNetwork = "10.0.0.0/22".parse().expect("cidr");
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let ipam = ipam.clone();
        tasks.push(tokio::spawn(async move {
            ipam.claim_affinity("host", cidr).await
        }));
    }
    for t in tasks {
        let (claimed, failed) = t.await.expect("join").expect("claim");
        assert_eq!((claimed.len(), failed.len()), (16, 0));
    }
    assert_eq!(ipam.host_affinities("host").await.expect("affs").len(), 16);
    assert_eq!(
        ipam.release_host_affinities("host", true)
            .await
            .expect("release"),
        16
    );
    assert!(ipam.blocks().await.expect("blocks").is_empty());
}

#[tokio::test]
async fn claim_affinity_reports_claimed_and_failed_blocks() {
    let ipam = mem_with(&[pool("p", "10.0.0.0/24", 26)]).await;
    let small: ipnetwork::IpNetwork = "10.0.0.0/27".parse().expect("cidr");
    assert!(matches!(
        ipam.claim_affinity("a", small).await,
        Err(IpamError::CidrTooSmall { .. })
    ));
    ipam.assign_ip(ip("10.0.0.1"), "x", Default::default(), "host-a", None)
        .await
        .expect("assign");
    let all: ipnetwork::IpNetwork = "10.0.0.0/24".parse().expect("cidr");
    let (c, f) = ipam.claim_affinity("host-b", all).await.expect("claim");
    assert_eq!((c.len(), f.len()), (3, 1));
    let (c, f) = ipam.claim_affinity("host-a", all).await.expect("claim");
    assert_eq!((c.len(), f.len()), (1, 3));
    assert_consistent(&ipam).await;
}

#[tokio::test]
async fn releasing_an_affinity_requires_an_empty_block_when_asked() {
    let ipam = mem_with(&[pool("p", "10.0.0.0/24", 30)]).await;
    let r = ipam
        .auto_assign(&AssignArgs::new("h", "x", 1, 0))
        .await
        .expect("assign");
    let block = r.ipv4[0];
    let block = ipnetwork::IpNetwork::new(block.network(), 30).expect("block");
    assert!(matches!(
        ipam.release_affinity("h", block, true).await,
        Err(IpamError::BlockNotEmpty { .. })
    ));
    assert_eq!(
        ipam.host_affinities("h").await.expect("affs")[0].state,
        AffinityState::Confirmed,
        "kept"
    );
    ipam.release_by_handle("x").await.expect("release");
    ipam.release_affinity("h", block, true)
        .await
        .expect("release affinity");
    assert!(ipam.blocks().await.expect("blocks").is_empty());
}

#[tokio::test]
async fn releasing_host_affinities_of_a_busy_host() {
    let ipam = mem_with(&[pool("p", "10.0.0.0/24", 30)]).await;
    ipam.auto_assign(&AssignArgs::new("h", "x", 12, 0))
        .await
        .expect("assign");
    assert_eq!(ipam.blocks().await.expect("b").len(), 3);
    ipam.release_by_handle("x").await.expect("release");
    assert_eq!(
        ipam.blocks().await.expect("b").len(),
        3,
        "empty affine blocks stay"
    );
    ipam.auto_assign(&AssignArgs::new("h", "y", 1, 0))
        .await
        .expect("assign");
    assert!(ipam.release_host_affinities("h", true).await.is_err());
    assert_eq!(ipam.blocks().await.expect("b").len(), 1);
    ipam.release_host_affinities("h", false)
        .await
        .expect("release");
    assert_eq!(
        ipam.blocks().await.expect("b").len(),
        1,
        "the busy block stays, unaffine"
    );
    ipam.release_by_handle("y").await.expect("release");
    assert!(
        ipam.blocks().await.expect("b").is_empty(),
        "an empty unaffine block is deleted"
    );
    assert_consistent(&ipam).await;
}

#[tokio::test]
async fn release_reports_unallocated_addresses() {
    let ipam = mem_with(&[pool("p", "192.168.1.0/24", 26)]).await;
    ipam.assign_ip(ip("192.168.1.0"), "x", Default::default(), "h", None)
        .await
        .expect("assign");
    let r = ipam
        .release_ips(&plain(&[ip("192.168.1.0")]))
        .await
        .expect("release");
    assert_eq!((r.released.len(), r.not_allocated.len()), (1, 0));
    let r = ipam
        .release_ips(&plain(&[ip("192.168.1.1")]))
        .await
        .expect("release");
    assert_eq!(r.not_allocated, vec![ip("192.168.1.1")]);
    let r = ipam
        .release_ips(&plain(&[ip("1.1.1.1")]))
        .await
        .expect("release");
    assert_eq!(r.not_allocated, vec![ip("1.1.1.1")]);
    let many = ipam
        .auto_assign(&AssignArgs::new("h", "y", 66, 0))
        .await
        .expect("assign");
    let r = ipam
        .release_ips(&plain(&many.ips()))
        .await
        .expect("release");
    assert_eq!((r.released.len(), r.not_allocated.len()), (66, 0));
    assert_consistent(&ipam).await;
}

#[tokio::test]
async fn stale_sequence_numbers_cannot_release_a_reused_address() {
    let ipam = mem_with(&[pool("p", "10.0.0.0/24", 30)]).await;
    for _ in 0..10 {
        let r = ipam
            .auto_assign(&AssignArgs::new("h", "H", 1, 0))
            .await
            .expect("assign");
        let a = r.ips()[0];
        let s = ipam
            .address_info(a)
            .await
            .expect("info")
            .sequence_number
            .expect("seq");
        ipam.release_by_handle("H").await.expect("release");
        ipam.assign_ip(a, "H", Default::default(), "h", None)
            .await
            .expect("reassign");
        let s2 = ipam
            .address_info(a)
            .await
            .expect("info")
            .sequence_number
            .expect("seq");
        assert_eq!(s2, s + 2);
        let stale = ReleaseCheck {
            sequence_number: Some(s),
            handle: Some("H".into()),
        };
        assert!(matches!(
            ipam.release_ips(&[(a, stale)]).await,
            Err(IpamError::Block { .. })
        ));
        let fresh = ReleaseCheck {
            sequence_number: Some(s2),
            handle: Some("H".into()),
        };
        assert_eq!(
            ipam.release_ips(&[(a, fresh)])
                .await
                .expect("release")
                .released
                .len(),
            1
        );
    }
    assert_consistent(&ipam).await;
}

#[tokio::test]
async fn sequence_numbers_survive_block_deletion() {
    let ipam = mem_with(&[pool("p", "10.0.0.0/24", 30)]).await;
    let a = ipam
        .auto_assign(&AssignArgs::new("h", "H", 1, 0))
        .await
        .expect("assign")
        .ips()[0];
    let s = ipam
        .address_info(a)
        .await
        .expect("info")
        .sequence_number
        .expect("seq");
    let block = ipnetwork::IpNetwork::new(a, 30).expect("b");
    let block = ipnetwork::IpNetwork::new(block.network(), 30).expect("b");
    ipam.release_affinity("h", block, false)
        .await
        .expect("unaffine");
    ipam.release_by_handle("H").await.expect("release");
    assert!(
        ipam.blocks().await.expect("b").is_empty(),
        "released block deleted"
    );
    ipam.assign_ip(a, "H", Default::default(), "h", None)
        .await
        .expect("recreate");
    let stale = ReleaseCheck {
        sequence_number: Some(s),
        handle: None,
    };
    assert!(ipam.release_ips(&[(a, stale)]).await.is_err());
}

#[tokio::test]
async fn duplicate_addresses_in_one_release_count_once() {
    let ipam = mem_with(&[pool("p", "10.0.0.0/26", 26)]).await;
    ipam.auto_assign(&AssignArgs::new("h", "x", 64, 0))
        .await
        .expect("fill");
    let r = ipam
        .release_ips(&plain(&[ip("10.0.0.1"), ip("10.0.0.1")]))
        .await
        .expect("release");
    assert_eq!(r.released.len(), 1);
    ipam.assign_ip(ip("10.0.0.1"), "y", Default::default(), "h", None)
        .await
        .expect("reassign");
    assert!(
        ipam.auto_assign(&AssignArgs::new("h", "z", 1, 0))
            .await
            .expect("none")
            .ipv4
            .is_empty()
    );
    assert_consistent(&ipam).await;
}

#[tokio::test]
async fn handle_lifecycle() {
    let ipam = mem_with(&[pool("p", "10.0.0.0/24", 26)]).await;
    assert!(matches!(
        ipam.ips_by_handle("nope").await,
        Err(IpamError::HandleNotFound { .. })
    ));
    ipam.auto_assign(&AssignArgs::new("h", "H", 1, 0))
        .await
        .expect("assign");
    assert_eq!(ipam.ips_by_handle("H").await.expect("ips").len(), 1);
    ipam.release_by_handle("H").await.expect("release");
    assert!(matches!(
        ipam.ips_by_handle("H").await,
        Err(IpamError::HandleNotFound { .. })
    ));
    assert!(matches!(
        ipam.release_by_handle("H").await,
        Err(IpamError::HandleNotFound { .. })
    ));
}

#[tokio::test]
async fn handle_caps_return_the_held_addresses() {
    let ipam = mem_with(&[pool("p", "10.0.0.0/24", 26), pool("p6", "fd00::/120", 122)]).await;
    let mut args = AssignArgs::new("h", "vm", 1, 1);
    args.max_per_handle = Some(1);
    let first = ipam.auto_assign(&args).await.expect("first");
    let second = ipam.auto_assign(&args).await.expect("second");
    assert_eq!(first.ips(), second.ips());
    assert_eq!(ipam.ips_by_handle("vm").await.expect("ips").len(), 2);
    args.num_v4 = 2;
    assert!(matches!(
        ipam.auto_assign(&args).await,
        Err(IpamError::HandleCap { .. })
    ));
}

#[tokio::test]
async fn assigning_a_specific_address() {
    let ipam = mem_with(&[pool("p", "192.168.1.0/24", 26)]).await;
    ipam.assign_ip(ip("192.168.1.0"), "a", Default::default(), "h", None)
        .await
        .expect("assign");
    let e = ipam
        .assign_ip(ip("192.168.1.0"), "b", Default::default(), "h", None)
        .await
        .expect_err("twice");
    assert!(
        matches!(
            e,
            IpamError::Block {
                source: BlockError::AlreadyAllocated { .. },
                ..
            }
        ),
        "{e}"
    );
    let e = ipam
        .assign_ip(ip("1.1.1.1"), "b", Default::default(), "h", None)
        .await
        .expect_err("outside");
    assert!(matches!(e, IpamError::NotInAnyPool { .. }));
    assert!(
        ipam.assign_ip(
            ip("192.168.1.9"),
            "b",
            Default::default(),
            "h",
            Some(IpUse::LoadBalancer)
        )
        .await
        .is_err()
    );
    assert_consistent(&ipam).await;
}

#[tokio::test]
async fn utilization_accounts_for_reservations() {
    type Figures = (u128, u128, u128, u128);
    let cases: [(&[&str], Figures, Figures); 4] = [
        (&["10.0.0.32/30"], (256, 1, 4, 251), (64, 1, 4, 59)),
        (&["10.0.0.128/25"], (256, 1, 128, 127), (64, 1, 0, 63)),
        (&["10.0.0.5/32"], (256, 1, 1, 255), (64, 1, 1, 63)),
        (
            &["10.0.0.0/25", "10.0.0.5/32", "10.0.0.64/26"],
            (256, 1, 128, 128),
            (64, 1, 64, 0),
        ),
    ];
    for (res, pool_u, block_u) in cases {
        let ipam = mem_with(&[pool("p", "10.0.0.0/24", 26)]).await;
        ipam.assign_ip(ip("10.0.0.5"), "x", Default::default(), "h", None)
            .await
            .expect("assign");
        ipam.put_reservation(Reservation {
            name: "r".into(),
            reserved_cidrs: res.iter().map(|c| c.parse().expect("c")).collect(),
        })
        .await
        .expect("reserve");
        let u = &ipam.utilization(true).await.expect("util")[0];
        assert_eq!(
            (u.capacity, u.in_use, u.reserved, u.available),
            pool_u,
            "pool with {res:?}"
        );
        let b = &u.blocks[0];
        assert_eq!(
            (b.capacity, b.in_use, b.reserved, b.available),
            block_u,
            "block with {res:?}"
        );
    }
}

#[tokio::test]
async fn bad_pools_are_refused_and_change_nothing() {
    let ipam = mem_with(&[pool("a", "10.0.0.0/16", 26)]).await;
    for (p, needle) in [
        (pool("b", "10.0.0.0/24", 26), "overlaps pool \"a\""),
        (pool("c", "10.1.0.0/24", 20), "block size /20 does not fit"),
        (pool("d", "10.1.0.0/24", 33), "block size /33"),
        (pool("e", "10.1.0.1/24", 26), "host bits"),
        (pool("A_B", "10.2.0.0/24", 26), "pool name"),
        (pool("a", "10.3.0.0/24", 26), "already exists"),
    ] {
        let e = ipam.add_pool(p).await.expect_err("bad pool");
        assert!(
            e.to_string().contains(needle),
            "{e} should mention {needle}"
        );
    }
    assert!(ipam::allocator::parse_pool_cidr("x", "10.0.0.0/33").is_err());
    assert_eq!(ipam.pools().await.expect("pools").len(), 1);
}

#[tokio::test]
async fn deleting_a_pool_with_addresses_needs_force() {
    let ipam = mem_with(&[pool("a", "10.0.0.0/24", 26)]).await;
    let r = ipam
        .auto_assign(&AssignArgs::new("h", "x", 1, 0))
        .await
        .expect("assign");
    assert!(matches!(
        ipam.delete_pool("a", false).await,
        Err(IpamError::PoolInUse { .. })
    ));
    ipam.delete_pool("a", true).await.expect("forced");
    ipam.add_pool(pool("b", "20.0.0.0/24", 26))
        .await
        .expect("new pool");
    let next = ipam
        .auto_assign(&AssignArgs::new("h", "y", 1, 0))
        .await
        .expect("assign");
    assert!(
        next.ipv4[0].ip().to_string().starts_with("20.0.0."),
        "the old affine block is not used"
    );
    assert_eq!(
        ipam.release_ips(&plain(&r.ips()))
            .await
            .expect("release")
            .released
            .len(),
        1,
        "old address still releasable"
    );
}

#[tokio::test]
async fn a_stale_block_hint_never_serves_a_block_the_host_lost() {
    let a = mem_with(&[pool("p", "10.8.0.0/24", 26)]).await;
    // Another client of the same datastore (another process, `weir ipam release-node`).
    let b = Ipam::new(a.store().clone());
    let first = a
        .auto_assign(&AssignArgs::new("h1", "net.a", 1, 0))
        .await
        .expect("first allocation claims a block");
    let lost = first.ipv4[0];
    let lost_block: ipnetwork::IpNetwork = format!(
        "{}/26",
        ipnetwork::Ipv4Network::new(
            match lost.ip() {
                IpAddr::V4(v4) => v4,
                IpAddr::V6(_) => unreachable!("an IPv4 pool"),
            },
            26,
        )
        .expect("block")
        .network()
    )
    .parse()
    .expect("block cidr");
    // Positive control: the host's next address comes from the same block (its hint).
    let second = a
        .auto_assign(&AssignArgs::new("h1", "net.b", 1, 0))
        .await
        .expect("second allocation");
    assert!(lost_block.contains(second.ipv4[0].ip()), "{second:?}");
    // `b` takes the block's affinity from h1 behind `a`'s back.
    b.release_affinity("h1", lost_block, false)
        .await
        .expect("release h1's affinity");
    let third = a
        .auto_assign(&AssignArgs::new("h1", "net.c", 1, 0))
        .await
        .expect("third allocation");
    let got = third.ipv4[0].ip();
    assert!(
        !lost_block.contains(got),
        "{got} came from {lost_block}, no longer h1's"
    );
    let own: Vec<ipnetwork::IpNetwork> = a
        .host_affinities("h1")
        .await
        .expect("affinities")
        .into_iter()
        .map(|x| x.cidr)
        .collect();
    assert!(
        own.iter().any(|c| c.contains(got)),
        "{got} is in one of h1's blocks {own:?}"
    );
    assert_consistent(&a).await;
}

/// A fuzz finding (`fuzz/`, target `ipam_records`): a stored block whose free list names an ordinal
/// outside the block made allocation index past its ordinals and panic. A block whose structure is
/// unsound is now refused as corrupt, naming its key, by every operation that changes it; `check` still
/// lists its problems.
#[tokio::test]
async fn a_block_with_an_unsound_structure_is_refused_not_a_panic() {
    use ipam::store::{Key, Kind};

    for (what, corrupt) in [
        (
            "out of range",
            (|b: &mut serde_json::Value| b["unallocated"][0] = 99.into())
                as fn(&mut serde_json::Value),
        ),
        ("ordinals, but its CIDR holds 64", |b| {
            b["allocations"]
                .as_array_mut()
                .expect("ordinals")
                .truncate(3);
            b["unallocated"] = serde_json::json!([2]);
        }),
    ] {
        let store = MemoryStore::new();
        let ipam = Ipam::new(store.clone());
        ipam.add_pool(pool("v4", "192.168.1.0/24", 26))
            .await
            .expect("add pool");
        let args = AssignArgs::new("node-a", "h1", 1, 0);
        let first = ipam.auto_assign(&args).await.expect("first allocation");
        let blocks = store.list(Kind::Block, "").await.expect("list blocks");
        let (name, stored) = blocks.first().expect("the block claimed");
        let mut block: serde_json::Value =
            serde_json::from_slice(&stored.value).expect("a stored block");
        corrupt(&mut block);
        let key = Key::new(Kind::Block, name.clone());
        store.force_put(key.clone(), serde_json::to_vec(&block).expect("json"));

        let err = ipam
            .auto_assign(&AssignArgs::new("node-a", "h2", 1, 0))
            .await
            .expect_err("an unsound block is refused")
            .to_string();
        assert!(
            err.contains(&key.to_string()) && err.contains(what),
            "{err}"
        );
        let err = ipam
            .release_ips(&plain(&first.ips()))
            .await
            .expect_err("an unsound block is refused")
            .to_string();
        assert!(err.contains(what), "{err}");
        let report = ipam.check().await.expect("check runs");
        assert!(
            report.problems.iter().any(|p| p.contains(what)),
            "{:#?}",
            report.problems
        );
    }
}
