//! The host interfaces' drivers through the loop over the fake kernel, as the endpoint and policy
//! drivers are: the XDP prefilter (its deny file through the real source) and the masquerade (the
//! pools as their source sends them) are applied by the loop; a read back over an unchanged
//! kernel writes nothing (writes counted); one interface whose attach fails leaves the others
//! programmed, shows in the snapshot and recovers with its backoff once the fault is gone, while
//! the pods' dataplane stays ready; a refused deny file keeps the last good set.

use std::{net::Ipv4Addr, path::Path, sync::Arc, time::Duration};

use ipnetwork::{IpNetwork, Ipv4Network};
use maps_schema::{
    MasqCidr, MasqInterface, PrefilterEntry,
    programs::{MASQ_EGRESS, MASQ_INGRESS},
};

use super::{
    converge::Agent,
    harness::{self, FakeKernel},
};
use crate::{
    control::applier::{self, Command},
    dataplane::{
        masquerade::{MasqDriver, parse_spec},
        prefilter::{Prefilter, PrefilterDriver, RULE_FILE, RULE_FLAG, parse_cidr},
    },
    kernel::{Prefix, fake::FakeMap},
    paths::Paths,
    sources::{
        link_source,
        prefilter_file::{DenyFile, DenyFileReads},
    },
};

/// The host drivers' maps over one fake kernel (the interfaces and pins are the kernel's).
struct HostMaps {
    deny4: FakeMap<Prefix<[u8; 4]>, PrefilterEntry>,
    deny6: FakeMap<Prefix<[u8; 16]>, PrefilterEntry>,
    masq_if: FakeMap<u32, MasqInterface>,
    masq_cidr: FakeMap<Prefix<[u8; 4]>, MasqCidr>,
}

impl HostMaps {
    fn new(kernel: &FakeKernel) -> Self {
        use maps_schema::maps::{MASQ_CIDR4, MASQ_IF, PREFILTER4, PREFILTER6};
        Self {
            deny4: kernel.fake.map(PREFILTER4),
            deny6: kernel.fake.map(PREFILTER6),
            masq_if: kernel.fake.map(MASQ_IF),
            masq_cidr: kernel.fake.map(MASQ_CIDR4),
        }
    }

    /// Writes to the host drivers' maps and attachments so far.
    fn writes(&self, kernel: &FakeKernel) -> u64 {
        self.deny4.mutations()
            + self.deny6.mutations()
            + self.masq_if.mutations()
            + self.masq_cidr.mutations()
            + u64::from(kernel.fake.xdp().mutations)
            + u64::from(kernel.fake.masq_table().mutations)
    }
}

const POOL: &str = "10.244.0.0/16";
const FLAG_DENY: &str = "192.0.2.0/24";

fn pools() -> Vec<Ipv4Network> {
    vec![POOL.parse().expect("pool")]
}

/// The fake kernel's host interfaces: eth1 and eth2, each with an address.
fn kernel_with_interfaces() -> FakeKernel {
    let kernel = FakeKernel::new();
    {
        let mut xdp = kernel.fake.xdp();
        xdp.current = 5;
        xdp.interfaces
            .extend(["eth1".to_owned(), "eth2".to_owned()]);
    }
    {
        let mut masq = kernel.fake.masq_table();
        masq.interfaces
            .insert("eth1".into(), (7, Some(Ipv4Addr::new(192, 0, 2, 7))));
        masq.interfaces
            .insert("eth2".into(), (8, Some(Ipv4Addr::new(198, 51, 100, 8))));
    }
    kernel
}

/// An agent over `kernel` with the prefilter and the masquerade on eth1 and eth2, the deny file
/// at `deny` read first and then followed by its source, and the pools' CIDRs; every driver reads
/// its kernel state back every `refresh`.
fn start(
    paths: &Paths,
    kernel: &FakeKernel,
    maps: &HostMaps,
    deny: &Path,
    refresh: Duration,
) -> (Agent, Arc<DenyFileReads>) {
    std::fs::create_dir_all(&paths.policy_dir).expect("policy dir");
    let mut node = harness::open_node(paths, kernel);
    let (file, first) = DenyFile::first_read(deny.to_owned());
    let interfaces = ["eth1".to_owned(), "eth2".to_owned()];
    node.host.prefilter = Some(Prefilter::new(
        PrefilterDriver::new(
            Box::new(kernel.fake.clone()),
            Box::new(maps.deny4.clone()),
            Box::new(maps.deny6.clone()),
        ),
        &interfaces,
        &[FLAG_DENY.to_owned()],
        Some(&first),
    ));
    let mut masquerade = MasqDriver::new(
        Box::new(kernel.fake.clone()),
        Box::new(maps.masq_if.clone()),
        Box::new(maps.masq_cidr.clone()),
    );
    masquerade.set_interfaces(interfaces.iter().map(|i| parse_spec(i).expect("interface")));
    masquerade.set_pools(pools());
    node.host.masquerade = Some(masquerade);
    node.set_refresh_interval(Some(refresh));
    let (handle, thread) = applier::spawn(node).expect("the loop starts");
    let links = tokio::spawn(link_source::supervise(
        handle.clone(),
        kernel.fake.clone(),
        |_| {},
    ));
    let reads = file.reads();
    tokio::spawn(file.run(handle.clone()));
    (Agent::from_parts(handle, thread, links), reads)
}

/// Writes the deny file through a rename, as editors do.
fn write(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

fn prefix4(net: &str) -> Prefix<[u8; 4]> {
    match parse_cidr(net).expect("cidr") {
        IpNetwork::V4(n) => Prefix {
            len: u32::from(n.prefix()),
            data: n.network().octets(),
        },
        IpNetwork::V6(_) => panic!("an IPv4 CIDR"),
    }
}

fn deny(entries: &[(&str, u32)]) -> Vec<(Prefix<[u8; 4]>, PrefilterEntry)> {
    let mut v: Vec<_> = entries
        .iter()
        .map(|(net, rule_id)| (prefix4(net), PrefilterEntry { rule_id: *rule_id }))
        .collect();
    v.sort_by_key(|(k, _)| *k);
    v
}

fn both(ifname: &str) -> Vec<(String, String)> {
    let mut v = vec![
        (ifname.to_owned(), MASQ_EGRESS.to_owned()),
        (ifname.to_owned(), MASQ_INGRESS.to_owned()),
    ];
    v.sort();
    v
}

fn masq_pins(kernel: &FakeKernel) -> Vec<(String, String)> {
    kernel.fake.masq_table().pins.keys().cloned().collect()
}

fn xdp_pins(kernel: &FakeKernel) -> Vec<(String, u32)> {
    kernel
        .fake
        .xdp()
        .pins
        .iter()
        .map(|(i, id)| (i.clone(), *id))
        .collect()
}

/// Until the loop has taken every command sent before: two round trips (the second is taken in
/// a batch after the first's, so after the first batch's apply).
async fn settled(agent: &Agent) {
    for _ in 0..2 {
        agent.handle.addresses().await.expect("the loop answers");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefilter_and_masquerade_are_applied_by_the_loop_and_a_read_back_writes_nothing() {
    let dir = tempfile::tempdir().expect("tmp");
    let paths = harness::paths(dir.path());
    let deny_path = dir.path().join("deny");
    write(&deny_path, "10.246.0.7/24\n");
    let kernel = kernel_with_interfaces();
    let maps = HostMaps::new(&kernel);
    // Left by an earlier run: a deny CIDR no longer wanted and a prefilter link on an interface no
    // longer named.
    maps.deny4
        .preload(&[(prefix4("198.18.0.0/15"), PrefilterEntry { rule_id: 1 })]);
    kernel.fake.xdp().pins.insert("eth9".into(), 5);
    let (agent, _reads) = start(
        &paths,
        &kernel,
        &maps,
        &deny_path,
        Duration::from_millis(50),
    );
    let ready = agent
        .wait("the host drivers applied", |s| {
            s.applied.ready && s.host.prefilter.len() == 2 && s.host.masquerade.len() == 4
        })
        .await;
    assert_eq!(ready.host.prefilter_error, None);
    assert_eq!(ready.host.masquerade_error, None);
    assert_eq!(
        maps.deny4.contents(),
        deny(&[("10.246.0.0/24", RULE_FILE), (FLAG_DENY, RULE_FLAG)]),
        "the file's and the flag's CIDRs, the stale one swept"
    );
    assert_eq!(
        xdp_pins(&kernel),
        vec![("eth1".to_owned(), 5), ("eth2".to_owned(), 5)],
        "the named interfaces run the prefilter; the orphan is detached"
    );
    let mut expected = both("eth1");
    expected.extend(both("eth2"));
    assert_eq!(masq_pins(&kernel), expected);
    assert_eq!(
        maps.masq_cidr.contents(),
        vec![(prefix4(POOL), MasqCidr::default())]
    );
    assert_eq!(
        maps.masq_if.contents(),
        vec![
            (
                7,
                MasqInterface {
                    addr: [192, 0, 2, 7],
                    flags: 0
                }
            ),
            (
                8,
                MasqInterface {
                    addr: [198, 51, 100, 8],
                    flags: 0
                }
            ),
        ]
    );

    // The same pools and deny set again, and the periodic read backs: applies, and no write.
    let writes = maps.writes(&kernel);
    assert!(writes > 0, "the first applies wrote (the count counts)");
    let applies = ready.host.applies;
    agent
        .handle
        .send(Command::MasqueradePools(pools()))
        .expect("send");
    agent
        .handle
        .send(Command::PrefilterDenyFile(Ok(vec![
            parse_cidr("10.246.0.0/24").expect("cidr"),
        ])))
        .expect("send");
    settled(&agent).await;
    agent
        .wait("two more applies (read backs)", |s| {
            s.host.applies >= applies + 2
        })
        .await;
    assert_eq!(
        maps.writes(&kernel),
        writes,
        "a read back over an unchanged kernel writes nothing"
    );
    agent.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interface_whose_attach_fails_is_isolated_shown_and_recovers() {
    let dir = tempfile::tempdir().expect("tmp");
    let paths = harness::paths(dir.path());
    let deny_path = dir.path().join("deny");
    write(&deny_path, "10.246.0.0/24\n");
    let kernel = kernel_with_interfaces();
    kernel.fake.xdp().failing.insert("eth2".into());
    kernel.fake.masq_table().failing.insert("eth2".into());
    let maps = HostMaps::new(&kernel);
    let (agent, _reads) = start(&paths, &kernel, &maps, &deny_path, Duration::from_secs(600));
    let failing = agent
        .wait("eth1 programmed, eth2 failing", |s| {
            s.applied.ready
                && s.host.prefilter.len() == 1
                && s.host.masquerade.len() == 2
                && s.host.prefilter_error.is_some()
                && s.host.masquerade_error.is_some()
        })
        .await;
    let shown = |e: &Option<String>| e.as_deref().is_some_and(|e| e.contains("eth2"));
    assert!(
        shown(&failing.host.prefilter_error),
        "{:?}",
        failing.host.prefilter_error
    );
    assert!(
        shown(&failing.host.masquerade_error),
        "{:?}",
        failing.host.masquerade_error
    );
    assert_eq!(
        failing.applied.error, None,
        "the pods' dataplane is not failed by a host interface"
    );
    assert_eq!(xdp_pins(&kernel), vec![("eth1".to_owned(), 5)]);
    assert_eq!(masq_pins(&kernel), both("eth1"));
    assert_eq!(
        maps.deny4.contents().len(),
        2,
        "the deny set is written whatever an interface does"
    );

    // The fault gone: the loop's backoff retries eth2.
    kernel.fake.xdp().failing.clear();
    kernel.fake.masq_table().failing.clear();
    let recovered = agent
        .wait("eth2 programmed after the fault", |s| {
            s.host.prefilter_error.is_none()
                && s.host.masquerade_error.is_none()
                && s.host.prefilter.len() == 2
                && s.host.masquerade.len() == 4
        })
        .await;
    assert!(recovered.applied.ready);
    assert_eq!(
        xdp_pins(&kernel),
        vec![("eth1".to_owned(), 5), ("eth2".to_owned(), 5)]
    );
    let mut expected = both("eth1");
    expected.extend(both("eth2"));
    assert_eq!(masq_pins(&kernel), expected);
    assert_eq!(maps.masq_if.contents().len(), 2);
    agent.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_deny_file_keeps_the_last_good_set_and_a_good_one_replaces_it() {
    let dir = tempfile::tempdir().expect("tmp");
    let paths = harness::paths(dir.path());
    let deny_path = dir.path().join("deny");
    write(&deny_path, "10.246.0.0/24\n");
    let kernel = kernel_with_interfaces();
    let maps = HostMaps::new(&kernel);
    let (agent, reads) = start(&paths, &kernel, &maps, &deny_path, Duration::from_secs(600));
    agent
        .wait("the prefilter applied", |s| s.host.prefilter.len() == 2)
        .await;
    let last_good = deny(&[("10.246.0.0/24", RULE_FILE), (FLAG_DENY, RULE_FLAG)]);
    assert_eq!(maps.deny4.contents(), last_good);
    let count = |r: &std::sync::atomic::AtomicU64| r.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!((count(&reads.applied), count(&reads.refused)), (1, 0));

    // A bad line (which would lift the deny if the file were taken): refused, counted once the
    // loop has it, and the maps keep the last good set.
    write(&deny_path, "192.0.2.0/24\nnot-a-cidr\n");
    agent
        .wait_until("the refusal counted", || count(&reads.refused) == 1)
        .await;
    settled(&agent).await;
    assert_eq!(maps.deny4.contents(), last_good, "the last good set stays");

    // The positive control: a good file replaces it through the same source.
    write(&deny_path, "10.247.0.0/24\n10.248.0.0/24\n");
    agent
        .wait_until("the good file applied", || {
            maps.deny4.contents()
                == deny(&[
                    ("10.247.0.0/24", RULE_FILE),
                    ("10.248.0.0/24", RULE_FILE),
                    (FLAG_DENY, RULE_FLAG),
                ])
        })
        .await;
    assert_eq!(count(&reads.applied), 2);
    agent.stop();
}
