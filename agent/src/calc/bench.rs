//! Micro-benchmark of the calculation alone (no kernel): 1,000 endpoints in 50 namespaces ×
//! 500 policies (pod and namespace selectors, match expressions, ports and a port range, CIDR
//! blocks with exceptions, egress rules). Reports the full build from empty, one pod's label
//! change and one policy edit (p50/p99 over many), each up to the drivers' desired state, the
//! writes each change leaves for the apply, and the old whole-state recompile for comparison.
//! `cargo xtask bench policy` measures the whole path with real kernel maps on top.
//!
//! `cargo test -p agent --release --lib calc::bench -- --ignored --nocapture`

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use ipnetwork::IpNetwork;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

use super::{Calculation, equivalence::Rng, testkit};

use weir_api::Endpoint;

use crate::calc::{
    identity::{Identities, LabelSet},
    policy::{
        compile::{Subject, compile},
        model::{Peer, Policy, PolicySet, PortSpec, Rule},
        selector::Selector,
    },
};

const NAMESPACES: u32 = 50;
const PODS_PER_NAMESPACE: u32 = 20;
const POLICIES_PER_NAMESPACE: u32 = 10;
const SAMPLES: usize = 400;

fn labels(pairs: &[(&str, String)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect()
}

fn match_labels(pairs: &[(&str, String)]) -> Selector {
    Selector::from_k8s(&LabelSelector {
        match_labels: Some(labels(pairs)),
        match_expressions: None,
    })
    .unwrap_or_default()
}

fn tcp(port: u16, end_port: Option<u16>) -> PortSpec {
    PortSpec {
        protocol: 6,
        port: Some(port),
        end_port,
    }
}

fn endpoints() -> Vec<Endpoint> {
    let mut out = Vec::new();
    for ns in 0..NAMESPACES {
        for j in 0..PODS_PER_NAMESPACE {
            let n = ns * PODS_PER_NAMESPACE + j;
            let ip = format!("10.200.{}.{}", n / 250, n % 250 + 1);
            let mut e = testkit::endpoint(n, &format!("ns{ns}"), &[], &[&ip]);
            e.id = n + 1;
            e.labels = labels(&[
                ("app", format!("a{}", j % 5)),
                ("rev", format!("r{}", j % 4)),
            ]);
            out.push(e);
        }
    }
    out
}

fn policy(ns: u32, k: u32) -> Policy {
    let app = |i: u32| format!("a{}", i % 5);
    let mut ingress = vec![
        Rule {
            peers: vec![Peer::Pods {
                namespaces: None,
                pods: Some(match_labels(&[("app", app(k + 1))])),
            }],
            ports: vec![tcp(80, None), tcp(443, None)],
            named_ports: Vec::new(),
        },
        Rule {
            peers: vec![Peer::Pods {
                namespaces: Some(match_labels(&[
                    ("team", format!("t{}", k % 5)),
                    ("env", "prod".into()),
                ])),
                pods: Selector::from_k8s(&LabelSelector {
                    match_labels: None,
                    match_expressions: Some(vec![LabelSelectorRequirement {
                        key: "app".into(),
                        operator: "In".into(),
                        values: Some(vec![app(k), app(k + 2)]),
                    }]),
                })
                .ok(),
            }],
            ports: vec![tcp(8080, Some(8090))],
            named_ports: Vec::new(),
        },
    ];
    if k.is_multiple_of(3) {
        let block = |s: String| s.parse::<IpNetwork>().ok();
        if let (Some(cidr), Some(except)) = (
            block(format!("10.{}.0.0/16", ns + 1)),
            block(format!("10.{}.1.0/24", ns + 1)),
        ) {
            ingress.push(Rule {
                peers: vec![Peer::Cidr {
                    cidr,
                    except: vec![except],
                }],
                ports: vec![tcp(5432, None)],
                named_ports: Vec::new(),
            });
        }
    }
    let egress_isolated = k.is_multiple_of(5);
    let egress = if egress_isolated {
        vec![Rule {
            peers: vec![Peer::Pods {
                namespaces: Some(match_labels(&[("team", format!("t{}", k % 5))])),
                pods: Some(match_labels(&[("app", app(k + 3))])),
            }],
            ports: vec![PortSpec {
                protocol: 17,
                port: Some(53),
                end_port: None,
            }],
            named_ports: Vec::new(),
        }]
    } else {
        Vec::new()
    };
    Policy {
        namespace: format!("ns{ns}"),
        name: format!("p{k}"),
        pod_selector: match_labels(&[("app", app(k))]),
        ingress_isolated: true,
        egress_isolated,
        ingress,
        egress,
    }
}

fn policy_set() -> PolicySet {
    let mut set = PolicySet::default();
    for ns in 0..NAMESPACES {
        set.namespaces.insert(
            format!("ns{ns}"),
            labels(&[
                ("team", format!("t{}", ns % 5)),
                (
                    "env",
                    if ns.is_multiple_of(2) { "prod" } else { "dev" }.to_owned(),
                ),
            ]),
        );
        for k in 0..POLICIES_PER_NAMESPACE {
            set.policies
                .insert((format!("ns{ns}"), format!("p{k}")), policy(ns, k));
        }
    }
    set
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    let rank = (p / 100.0 * samples.len() as f64).ceil() as usize;
    samples[rank.clamp(1, samples.len()) - 1]
}

/// CPU time this thread has used (so preemption on a loaded machine can be told apart).
fn thread_cpu() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map_or(Duration::ZERO, Duration::from)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[test]
#[ignore = "benchmark: run with --release -- --ignored --nocapture"]
fn calculation_figures() {
    let dir = tempfile::tempdir().expect("tmp");
    let set = policy_set();
    let mut pods = endpoints();
    let (mut dp, maps) = testkit::dataplane();
    for e in &pods {
        dp.endpoints_manager
            .link_up(&mut dp.endpoints, &e.host_ifname, e.id);
    }

    // Full build from empty: identities allocated and persisted, every desired map filled.
    let started = Instant::now();
    let identities = Identities::load(&dir.path().join("identities.json")).expect("ids");
    let mut calc = Calculation::new(identities);
    calc.set_policies(&set).expect("policies");
    let refs: Vec<&Endpoint> = pods.iter().collect();
    calc.upsert_endpoints(&refs).expect("endpoints");
    calc.flush(&mut dp);
    let full = started.elapsed();
    dp.apply().expect("apply");
    let full_writes = maps.take().len();
    let (classes, policies, rules, peers, groups) = calc.sizes();

    // The previous way: a whole-state compile on every event (identities already allocated).
    let mut ids = Identities::load(&dir.path().join("identities.json")).expect("ids");
    let started = Instant::now();
    let subjects: Vec<Subject<'_>> = pods
        .iter()
        .map(|e| Subject {
            endpoint: e,
            identity: ids
                .get(&LabelSet::for_pod(
                    &e.labels,
                    &e.namespace,
                    set.namespaces.get(&e.namespace).unwrap_or(&BTreeMap::new()),
                ))
                .unwrap_or_default(),
        })
        .collect();
    let compiled = compile(&set, &subjects, &mut ids).expect("compile");
    let recompile = started.elapsed();
    assert_eq!(
        compiled.policy.len(),
        dp.policy.len(),
        "same entries as the full compile"
    );

    // One pod's label change: `rev` to another value (a label set other pods have), or a
    // `canary` label added or removed (the first time, a label set no pod had: a new class, whose
    // identity is allocated and durably written before it is used).
    let mut rng = Rng::new(7);
    let (mut known_times, mut new_times, mut known_cpu) = (Vec::new(), Vec::new(), Vec::new());
    let mut label_writes = Vec::new();
    for i in 0..SAMPLES {
        let at = rng.below(pods.len());
        let pod = &mut pods[at];
        if i.is_multiple_of(2) {
            let rev = format!("r{}", (rng.below(3) + 1 + pod.id as usize) % 4);
            pod.labels.insert("rev".into(), rev);
        } else if pod.labels.remove("canary").is_none() {
            pod.labels.insert("canary".into(), "true".into());
        }
        let allocated = calc.identities.len();
        let (started, cpu) = (Instant::now(), thread_cpu());
        calc.upsert_endpoints(&[&*pod]).expect("upsert");
        calc.flush(&mut dp);
        let took = started.elapsed();
        if calc.identities.len() == allocated {
            known_times.push(took);
            known_cpu.push(thread_cpu().saturating_sub(cpu));
        } else {
            new_times.push(took);
        }
        dp.apply().expect("apply");
        label_writes.push(maps.take().len());
    }

    // One policy edit: a port of a rule, or the pod selector of a peer.
    let mut set = set;
    let (mut policy_times, mut policy_cpu) = (Vec::new(), Vec::new());
    let mut policy_writes = Vec::new();
    for i in 0..SAMPLES {
        let ns = u32::try_from(rng.below(NAMESPACES as usize)).unwrap_or(0);
        let k = u32::try_from(rng.below(POLICIES_PER_NAMESPACE as usize)).unwrap_or(0);
        let Some(p) = set.policies.get_mut(&(format!("ns{ns}"), format!("p{k}"))) else {
            continue;
        };
        if i.is_multiple_of(2) {
            let port = if p.ingress[0].ports[1].port == Some(443) {
                8443
            } else {
                443
            };
            p.ingress[0].ports[1] = tcp(port, None);
        } else {
            let app = format!("a{}", rng.below(5));
            p.ingress[0].peers = vec![Peer::Pods {
                namespaces: None,
                pods: Some(match_labels(&[("app", app)])),
            }];
        }
        let (started, cpu) = (Instant::now(), thread_cpu());
        calc.set_policies(&set).expect("policies");
        calc.flush(&mut dp);
        policy_times.push(started.elapsed());
        policy_cpu.push(thread_cpu().saturating_sub(cpu));
        dp.apply().expect("apply");
        policy_writes.push(maps.take().len());
    }

    let mean = |v: &[usize]| v.iter().sum::<usize>() as f64 / v.len().max(1) as f64;
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "calculation benchmark: {NAMESPACES} namespaces, {} endpoints, {} policies",
        pods.len(),
        policies
    );
    println!(
        "  state: {classes} label classes, {rules} rules, {peers} selector-cache entries, {groups} entry groups, {} policy entries",
        dp.policy.len()
    );
    println!(
        "  full build from empty:       {:>8.1} ms  ({full_writes} writes)",
        ms(full)
    );
    println!(
        "  old whole-state compile:     {:>8.1} ms  (was paid on every event)",
        ms(recompile)
    );
    println!(
        "  label change, label set in use:   p50 {:>6.3} ms  p99 {:>6.3} ms  max {:>6.3} ms  ({} samples)",
        ms(percentile(&mut known_times, 50.0)),
        ms(percentile(&mut known_times, 99.0)),
        ms(percentile(&mut known_times, 100.0)),
        known_times.len()
    );
    println!(
        "    (its CPU time:                   p50 {:>6.3} ms  p99 {:>6.3} ms)",
        ms(percentile(&mut known_cpu, 50.0)),
        ms(percentile(&mut known_cpu, 99.0)),
    );
    println!(
        "  label change, new identity:       p50 {:>6.3} ms  p99 {:>6.3} ms  max {:>6.3} ms  ({} samples; includes the identity file's fsync)",
        ms(percentile(&mut new_times, 50.0)),
        ms(percentile(&mut new_times, 99.0)),
        ms(percentile(&mut new_times, 100.0)),
        new_times.len()
    );
    println!(
        "  label change writes: mean {:.1}, max {}",
        mean(&label_writes),
        label_writes.iter().max().unwrap_or(&0)
    );
    println!(
        "  policy edit:                      p50 {:>6.3} ms  p99 {:>6.3} ms  max {:>6.3} ms  (writes: mean {:.1}, max {})",
        ms(percentile(&mut policy_times, 50.0)),
        ms(percentile(&mut policy_times, 99.0)),
        ms(percentile(&mut policy_times, 100.0)),
        mean(&policy_writes),
        policy_writes.iter().max().unwrap_or(&0)
    );
    println!(
        "    (its CPU time:                   p50 {:>6.3} ms  p99 {:>6.3} ms)",
        ms(percentile(&mut policy_cpu, 50.0)),
        ms(percentile(&mut policy_cpu, 99.0)),
    );
    println!("  load average: {}", load.trim());
}
