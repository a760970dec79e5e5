//! The datapath's own counters in `/metrics`: verdicts by reason and direction (`counters_v1`)
//! and per-rule hits (`rule_hits_v1`), read from the pinned maps at scrape time.
//!
//! - `weir_drop_count_total{reason,direction}` / `weir_drop_bytes_total`: dropped packets by
//!   drop reason (`maps_schema::reason`, codes 1–31).
//! - `weir_forward_count_total{direction}` / `weir_forward_bytes_total`: packets passed (every
//!   pass reason summed: new flows, established, related, neighbour, policy).
//! - `weir_policy_rule_packets_total{policy,direction,rule}` / `weir_policy_rule_bytes_total`:
//!   packets each policy rule decided (`maps_schema::rules`: not the established packets
//!   conntrack passes).

use std::collections::BTreeMap;

use prometheus_client::metrics::{counter::Counter, family::Family};

use super::rule_hits::RuleHitsView;
use crate::dataplane::counters::CounterView;

type Labels = Vec<(String, String)>;

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Registers the verdict and rule counters read from the maps.
pub fn families(
    counters: &[CounterView],
    rules: &[RuleHitsView],
) -> Vec<(&'static str, &'static str, Family<Labels, Counter>)> {
    let mut out = Vec::new();
    let drops = Family::<Labels, Counter>::default();
    let drop_bytes = Family::<Labels, Counter>::default();
    let mut forwards: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for c in counters {
        if maps_schema::reason::is_drop(c.code) {
            let l = labels(&[("reason", &c.reason), ("direction", &c.direction)]);
            drops.get_or_create(&l).inc_by(c.packets);
            drop_bytes.get_or_create(&l).inc_by(c.bytes);
        } else if maps_schema::reason::is_pass(c.code) {
            let f = forwards.entry(c.direction.as_str()).or_default();
            f.0 += c.packets;
            f.1 += c.bytes;
        }
    }
    let fwd = Family::<Labels, Counter>::default();
    let fwd_bytes = Family::<Labels, Counter>::default();
    for (direction, (packets, bytes)) in forwards {
        let l = labels(&[("direction", direction)]);
        fwd.get_or_create(&l).inc_by(packets);
        fwd_bytes.get_or_create(&l).inc_by(bytes);
    }
    out.push((
        "drop_count",
        "Packets the programs dropped, by drop reason and direction (weir bpf counters)",
        drops,
    ));
    out.push((
        "drop_bytes",
        "Bytes of the packets the programs dropped, by drop reason and direction",
        drop_bytes,
    ));
    out.push((
        "forward_count",
        "Packets the programs passed (every pass reason), by direction",
        fwd,
    ));
    out.push((
        "forward_bytes",
        "Bytes of the packets the programs passed, by direction",
        fwd_bytes,
    ));
    let packets = Family::<Labels, Counter>::default();
    let bytes = Family::<Labels, Counter>::default();
    for r in rules {
        let rule = if r.policy.is_empty() {
            format!("id-{}", r.rule_id)
        } else {
            r.index.to_string()
        };
        let l = labels(&[
            ("policy", &r.policy),
            ("direction", &r.direction),
            ("rule", &rule),
        ]);
        packets.get_or_create(&l).inc_by(r.packets);
        bytes.get_or_create(&l).inc_by(r.bytes);
    }
    out.push(("policy_rule_packets", "Packets each policy rule decided (new flows on the isolated side and stateless packets; established packets conntrack passes are not counted)", packets));
    out.push((
        "policy_rule_bytes",
        "Bytes of the packets each policy rule decided",
        bytes,
    ));
    out
}

/// The datapath's counters at scrape time: verdicts from `counters_v1`, rule hits from
/// `rule_hits_v1` named by the loop's latest snapshot. A map that cannot be read is logged and
/// its metrics left out of that scrape.
#[derive(Debug)]
pub struct DatapathCollector {
    /// The loop's snapshots (rule names).
    pub snapshot: tokio::sync::watch::Receiver<std::sync::Arc<crate::control::snapshot::Snapshot>>,
    /// The pinned maps, through the kernel seam.
    pub kernel: std::sync::Arc<dyn crate::kernel::InspectIo>,
}

impl prometheus_client::collector::Collector for DatapathCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder<'_>,
    ) -> Result<(), std::fmt::Error> {
        let counters = crate::dataplane::counters::read(&*self.kernel).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot read the verdict counters for /metrics");
            Vec::new()
        });
        let rules = std::sync::Arc::clone(&self.snapshot.borrow().rules);
        let hits = super::rule_hits::read(&*self.kernel, &rules).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot read the rule hit counters for /metrics");
            Vec::new()
        });
        for (name, help, family) in families(&counters, &hits) {
            let metric = encoder.encode_descriptor(
                name,
                help,
                None,
                prometheus_client::metrics::MetricType::Counter,
            )?;
            prometheus_client::encoding::EncodeMetric::encode(&family, metric)?;
        }
        Ok(())
    }
}
