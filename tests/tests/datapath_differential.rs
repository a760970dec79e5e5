//! The datapath against its model: random map states and random packets (valid, truncated,
//! hostile) through `from_endpoint`/`to_endpoint` with `BPF_PROG_TEST_RUN` and through
//! `tests::dpmodel`; verdict, reason, rewritten bytes, rule hits and the conntrack, Service-flow
//! and affinity entries written must agree ([docs/differential.md](../../docs/differential.md)).
//!
//! Seeded: `WEIR_TEST_SEED` replays a run (the seed is printed); `WEIR_DIFF_CASES` sets how many
//! packets (default 100,000). A mismatch prints its seed, its state and a shrunk case.

use std::collections::BTreeMap;

use maps_schema::reason::{DROP_UNKNOWN_ENDPOINT, is_pass};
use tests::{
    datapath::{Fam, Lab},
    differential::{
        Case, Kernel, Packet, Rng, State, check_all, coarse_now, describe, gen_packet, gen_state,
        shrink, step,
    },
    dpmodel::{Maps, Run, TC_ACT_OK},
};

/// Packets per map state: the state's flows build up (replies, deliveries, ICMP errors).
const PER_STATE: usize = 200;

/// Classes each run must have produced (a generator that stops making one fails the test).
/// `svc-tuple-taken` is reported only: about 5 in 100,000 cases, too rare to require.
const CLASSES: &[&str] = &[
    "ipv4",
    "ipv6",
    "other-ethertype",
    "tcp",
    "udp",
    "icmp",
    "sctp",
    "other-protocol",
    "fragment",
    "ip-options",
    "truncated",
    "hostile",
    "follows",
    "icmp-error",
    "translated",
    "reply-translated",
    "related-translated",
    "hairpin",
    "no-backend-answer",
    "plain-pass",
    "drop",
    "ct-created",
    "ct-established",
    "unknown-endpoint",
    "svc-kept-backend",
    "svc-affinity",
    "svc-pod-nodeport",
    "csum-state-unknown",
];

fn classify(p: &Packet, run: &Run, counts: &mut BTreeMap<&'static str, u64>) {
    let mut bump = |c: &'static str| *counts.entry(c).or_insert(0) += 1;
    let f = &p.frame;
    let et = u16::from_be_bytes([f[12], f[13]]);
    let (proto, fragment, options) = match et {
        0x0800 if f.len() >= 34 => {
            bump("ipv4");
            let frag = u16::from_be_bytes([f[20], f[21]]) & 0x3fff != 0;
            (f[23], frag, f[14] & 0x0f > 5)
        }
        0x86DD if f.len() >= 54 => {
            bump("ipv6");
            let (mut next, mut off, mut seen, mut frag) = (f[20], 54, false, false);
            while matches!(next, 0 | 43 | 44 | 51 | 60) && off + 2 <= f.len() {
                seen = true;
                frag |= next == 44;
                let len = if next == 51 {
                    (usize::from(f[off + 1]) + 2) * 4
                } else if next == 44 {
                    8
                } else {
                    (usize::from(f[off + 1]) + 1) * 8
                };
                next = f[off];
                off += len;
            }
            (next, frag, seen)
        }
        _ => {
            bump("other-ethertype");
            (255, false, false)
        }
    };
    match proto {
        6 => bump("tcp"),
        17 => bump("udp"),
        1 | 58 => bump("icmp"),
        132 => bump("sctp"),
        255 => {}
        _ => bump("other-protocol"),
    }
    if matches!(proto, 1 | 58) {
        let l4 = if et == 0x0800 {
            14 + usize::from(f[14] & 0x0f) * 4
        } else {
            54
        };
        if f.get(l4)
            .is_some_and(|t| matches!((proto, t), (1, 3 | 11 | 12) | (58, 1..=4)))
        {
            bump("icmp-error");
        }
    }
    if fragment {
        bump("fragment");
    }
    if options {
        bump("ip-options");
    }
    for (on, c) in [
        (p.kind.truncated, "truncated"),
        (p.kind.hostile, "hostile"),
        (p.kind.follows, "follows"),
        (run.trail.translated, "translated"),
        (run.trail.reply_translated, "reply-translated"),
        (run.trail.related_translated, "related-translated"),
        (run.trail.hairpin, "hairpin"),
        (run.trail.unreachable, "no-backend-answer"),
        (run.trail.ct_created, "ct-created"),
        (run.trail.ct_hit, "ct-established"),
        (run.trail.kept_backend, "svc-kept-backend"),
        (run.trail.affinity, "svc-affinity"),
        (run.trail.taken, "svc-tuple-taken"),
        (run.trail.node_port, "svc-pod-nodeport"),
        (run.trail.csum_unknown, "csum-state-unknown"),
        (run.reason == DROP_UNKNOWN_ENDPOINT, "unknown-endpoint"),
        (!is_pass(run.reason), "drop"),
        (
            run.action == TC_ACT_OK && !run.trail.translated && !run.trail.reply_translated,
            "plain-pass",
        ),
    ] {
        if on {
            bump(c);
        }
    }
}

struct Report {
    cases: u64,
    mismatches: u64,
    refused: u64,
    states: u64,
    counts: BTreeMap<&'static str, u64>,
    failures: Vec<String>,
}

fn state_seed(seed: u64, state: u64) -> u64 {
    Rng::new(seed ^ state.wrapping_mul(0x9e37_79b9_7f4a_7c15)).bits()
}

fn run_all(k: &mut Kernel<'_>, seed: u64, want: u64) -> Report {
    let mut r = Report {
        cases: 0,
        mismatches: 0,
        refused: 0,
        states: 0,
        counts: BTreeMap::new(),
        failures: Vec::new(),
    };
    while r.cases < want {
        let state_no = r.states;
        r.states += 1;
        let mut rng = Rng::new(state_seed(seed, state_no));
        let start = coarse_now();
        let initial = gen_state(&mut rng, &k.ifindex, start);
        let mut state = State {
            maps: initial.maps.clone(),
            now: start,
        };
        k.reset(&state.maps);
        let mut counters = k.counters();
        let mut rules = k.rule_hits();
        let mut history: Vec<(Packet, Vec<u8>)> = Vec::new();
        let mut sent = Vec::new();
        let mut bad = Vec::new();
        for _ in 0..PER_STATE {
            let p = gen_packet(&mut rng, &state, &k.ifindex, &history);
            match step(k, &mut state, start, &p, &mut counters) {
                Err(_) => r.refused += 1,
                Ok((mismatch, run)) => {
                    r.cases += 1;
                    classify(&p, &run, &mut r.counts);
                    if run.rule != 0 {
                        *rules.entry(run.rule).or_insert(0) += 1;
                    }
                    sent.push(p.clone());
                    if !mismatch.is_empty() {
                        bad = mismatch;
                        break;
                    }
                    history.push((p, run.out));
                }
            }
        }
        if bad.is_empty() {
            bad = check_all(k, &state.maps, state.now, start);
            let got = k.counters();
            if got != counters {
                bad.push("verdict or note counters differ at the state's end".to_owned());
            }
            if k.rule_hits() != rules {
                bad.push("rule hits differ at the state's end".to_owned());
            }
        }
        if bad.is_empty() {
            continue;
        }
        r.mismatches += 1;
        if r.failures.len() < 3 {
            let case = Case {
                state: initial,
                packets: sent,
            };
            let (small, why) = shrink(k, case, 600);
            r.failures.push(format!(
                "seed {seed} state {state_no}: {}\nshrunk to: {}\n{}",
                bad.join("\n  "),
                why.join("\n  "),
                describe(&small, &k.ifindex)
            ));
        }
    }
    r
}

/// The positive control: a model that lacks the kernel's endpoints must be caught disagreeing.
fn control(k: &mut Kernel<'_>, seed: u64) -> usize {
    let mut rng = Rng::new(seed);
    let start = coarse_now();
    let state = loop {
        let s = gen_state(&mut rng, &k.ifindex, start);
        if !s.maps.endpoints.is_empty() {
            break s;
        }
    };
    k.reset(&state.maps);
    let mut model = State {
        maps: Maps {
            endpoints: std::collections::HashMap::new(),
            ..state.maps.clone()
        },
        now: start,
    };
    let mut counters = k.counters();
    let mut caught = 0;
    for _ in 0..100 {
        let p = gen_packet(&mut rng, &state, &k.ifindex, &[]);
        if let Ok((bad, _)) = step(k, &mut model, start, &p, &mut counters)
            && !bad.is_empty()
        {
            caught += 1;
        }
    }
    caught
}

#[test]
fn the_datapath_matches_its_model() {
    let Some(mut lab) = Lab::new("the_datapath_matches_its_model", Fam::V4) else {
        return;
    };
    let seed = std::env::var("WEIR_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| coarse_now() ^ u64::from(std::process::id()));
    let want: u64 = std::env::var("WEIR_DIFF_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
    println!("differential: seed {seed} (WEIR_TEST_SEED={seed} replays it), {want} cases");
    let began = std::time::Instant::now();
    let ifindex = lab.ifindex;
    let Lab { ebpf, ns, .. } = &mut lab;
    let report = ns.run(|| {
        let mut k = Kernel { ebpf, ifindex };
        let report = run_all(&mut k, seed, want);
        (report, control(&mut k, seed))
    });
    let (report, caught) = report;
    println!(
        "differential_cases={} differential_mismatches={} (states {}, runs the kernel refused {}, {:.1} s)",
        report.cases,
        report.mismatches,
        report.states,
        report.refused,
        began.elapsed().as_secs_f64()
    );
    for (class, n) in &report.counts {
        println!("  {class}: {n}");
    }
    for f in &report.failures {
        println!("MISMATCH {f}");
    }
    assert!(
        caught > 0,
        "control: a model without the kernel's endpoints was never caught disagreeing"
    );
    println!("control: {caught} of 100 packets caught against a model without endpoints");
    assert!(report.cases >= want, "ran {} of {want} cases", report.cases);
    let missing: Vec<&str> = CLASSES
        .iter()
        .copied()
        .filter(|c| report.counts.get(c).copied().unwrap_or(0) == 0)
        .collect();
    assert!(
        missing.is_empty(),
        "the generator made no case of {missing:?} (seed {seed})"
    );
    assert_eq!(
        report.mismatches, 0,
        "the datapath and its model disagree (seed {seed}); cases above"
    );
}
