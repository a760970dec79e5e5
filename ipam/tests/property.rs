//! Property test: random operations across 8 hosts with injected conflicts and crashes at every write;
//! the invariants hold after every step. Runs on the memory store and on a real etcd.

use std::net::IpAddr;

use ipam::{
    AssignArgs, Ipam, IpamError,
    model::{IpPool, IpUse, IpamConfig, ReleaseCheck},
    store::{
        Store, StoreError,
        etcd::EtcdStore,
        memory::{Faults, MemoryStore},
    },
    testing::{EtcdServer, Faulty},
};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn pool(name: &str, cidr: &str, bs: u8) -> IpPool {
    IpPool {
        name: name.into(),
        cidr: cidr.parse().expect("cidr"),
        block_size: bs,
        node_selector: String::new(),
        namespace_selector: String::new(),
        allowed_uses: vec![IpUse::Workload],
        disabled: false,
    }
}

/// Whether an error is one a fault could cause (anything else is a bug).
fn tolerated(e: &IpamError) -> bool {
    matches!(
        e,
        IpamError::Store(StoreError::Injected { .. } | StoreError::Conflict { .. })
            | IpamError::TooManyRetries { .. }
            | IpamError::HandleNotFound { .. }
            | IpamError::Block { .. }
            | IpamError::BlockNotEmpty { .. }
            | IpamError::NotAffine { .. }
    )
}

async fn run<S: Store + Clone>(
    ipam: &Ipam<S>,
    set_faults: &dyn Fn(Faults, u64),
    steps: usize,
    seed: u64,
) {
    // Small blocks in a small pool, so claims, borrowing, exhaustion and reclaim all happen.
    ipam.add_pool(pool("v4", "10.9.0.0/25", 29))
        .await
        .expect("pool");
    ipam.add_pool(pool("v6", "fd09::/121", 125))
        .await
        .expect("pool");
    let mut rng = Rng(seed);
    let mut held: Vec<(String, IpAddr)> = Vec::new();
    for step in 0..steps {
        let faults = Faults {
            conflict_per_mille: 100,
            fail_before_per_mille: 60,
            fail_after_per_mille: 60,
        };
        set_faults(faults, seed.wrapping_add(step as u64));
        let host = format!("host{}", rng.below(8));
        let op = rng.below(10);
        let result: Result<(), IpamError> = match op {
            0..=3 => {
                let handle = format!("c{step}");
                let args =
                    AssignArgs::new(&host, &handle, 1 + rng.below(3) as u32, rng.below(2) as u32);
                ipam.auto_assign(&args)
                    .await
                    .map(|r| held.extend(r.ips().into_iter().map(|ip| (handle.clone(), ip))))
            }
            4 | 5 if !held.is_empty() => {
                let (h, ip) = held.swap_remove(rng.below(held.len() as u64) as usize);
                let check = ReleaseCheck {
                    handle: Some(h),
                    sequence_number: None,
                };
                ipam.release_ips(&[(ip, check)]).await.map(drop)
            }
            6 if !held.is_empty() => {
                let h = held[rng.below(held.len() as u64) as usize].0.clone();
                held.retain(|(x, _)| *x != h);
                ipam.release_by_handle(&h).await.map(drop)
            }
            7 => ipam
                .release_host_affinities(&host, rng.below(2) == 0)
                .await
                .map(drop),
            8 => {
                let ip: IpAddr = format!("10.9.0.{}", rng.below(128)).parse().expect("ip");
                let handle = format!("s{step}");
                ipam.assign_ip(ip, &handle, Default::default(), &host, None)
                    .await
                    .map(|_| held.push((handle, ip)))
            }
            _ => {
                let strict = rng.below(2) == 0;
                let c = IpamConfig {
                    strict_affinity: strict,
                    ..IpamConfig::default()
                };
                ipam.set_config(c).await
            }
        };
        if let Err(e) = &result {
            assert!(tolerated(e), "step {step} (op {op}): unexpected error: {e}");
        }
        set_faults(Faults::default(), 0);
        let report = ipam.check().await.expect("check");
        assert!(
            report.ok(),
            "step {step} (op {op}, {result:?}): {:#?}",
            report.problems
        );
    }
    // Everything can still be released and the store converges to no live address.
    set_faults(Faults::default(), 0);
    let all: Vec<IpAddr> = ipam
        .blocks()
        .await
        .expect("blocks")
        .iter()
        .flat_map(|b| b.live_ordinals().map(|o| b.ip(o)).collect::<Vec<_>>())
        .collect();
    let plain: Vec<_> = all
        .iter()
        .map(|ip| (*ip, ReleaseCheck::default()))
        .collect();
    ipam.release_ips(&plain).await.expect("release all");
    let report = ipam.check().await.expect("check");
    assert!(report.ok() && report.allocations == 0, "{report:#?}");
}

#[tokio::test]
async fn random_operations_keep_invariants_on_memory() {
    for seed in [1u64, 7, 42, 1234] {
        let store = MemoryStore::new();
        let ipam = Ipam::new(store.clone());
        let s = store.clone();
        run(&ipam, &move |f, seed| s.set_faults(f, seed), 300, seed).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_operations_keep_invariants_on_etcd() {
    let Some(etcd) = EtcdServer::start_or_skip() else {
        return;
    };
    let store = Faulty::new(
        EtcdStore::connect(&[etcd.url().to_owned()])
            .await
            .expect("connect"),
    );
    let ipam = Ipam::new(store.clone());
    let s = store.clone();
    run(&ipam, &move |f, seed| s.set_faults(f, seed), 120, 99).await;
}
