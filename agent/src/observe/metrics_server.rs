//! Metrics and health on `--metrics` (127.0.0.1:9972): `/metrics` (Prometheus text), `/healthz`,
//! `/readyz`. The registry is built once; its collectors read the snapshot the dataplane loop
//! published last and the conntrack sweep's counters at scrape time. Plain scrapers (curl,
//! `promtool`) get the Prometheus text format; a scraper that asks for OpenMetrics gets it.

use std::sync::{Arc, Mutex, PoisonError};

use axum::{
    Router,
    extract::State,
    http::{HeaderMap, StatusCode, header},
    routing::get,
};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _, prometheus_text, text},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
    registry::{Registry, Unit},
};
use tokio::sync::watch;

pub use crate::{
    calc::ipam_service::{PoolUsage, PoolUsageCache},
    control::snapshot::{LoopMeasures, SourceSync},
};
use crate::{
    control::snapshot::Snapshot,
    dataplane::{conntrack::CtStats, nat_stats::NatStats},
};

type Label = [(&'static str, String); 1];

fn counter_family(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    values: &[(Label, u64)],
) -> Result<(), std::fmt::Error> {
    let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, value) in values {
        ConstCounter::new(*value).encode(metric.encode_family(labels)?)?;
    }
    Ok(())
}

fn gauge_family(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    values: &[(Label, u64)],
) -> Result<(), std::fmt::Error> {
    let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in values {
        ConstGauge::new(i64::try_from(*value).unwrap_or(i64::MAX))
            .encode(metric.encode_family(labels)?)?;
    }
    Ok(())
}

/// The cluster's nodes by health, and how long each silent one has not been heard from (none without
/// node records).
fn node_families(
    encoder: &mut DescriptorEncoder<'_>,
    nodes: &[weir_api::NodeStatus],
) -> Result<(), std::fmt::Error> {
    if nodes.is_empty() {
        return Ok(());
    }
    let nodes = crate::cluster::routing::seen_now(nodes);
    let health = |h: &str| [("health", h.to_owned())];
    let by_health: Vec<_> = [
        weir_api::NodeStatus::LOCAL,
        weir_api::NodeStatus::ALIVE,
        weir_api::NodeStatus::SILENT,
    ]
    .into_iter()
    .map(|h| {
        (
            health(h),
            nodes.iter().filter(|n| n.health == h).count() as u64,
        )
    })
    .collect();
    gauge_family(
        encoder,
        "nodes",
        "The cluster's nodes by health: local, alive, silent (no heartbeat within its expiry; still routed)",
        &by_health,
    )?;
    let silent: Vec<_> = nodes
        .iter()
        .filter(|n| n.is_silent())
        .map(|n| ([("node", n.name.clone())], n.last_seen_secs.unwrap_or(0)))
        .collect();
    gauge_family(
        encoder,
        "node_silent_seconds",
        "Seconds since each silent node's last heartbeat (its routes stay until its record is deleted)",
        &silent,
    )
}

/// The drivers' counters and the loop's progress, from the latest snapshot.
#[derive(Debug)]
struct DataplaneCollector(watch::Receiver<Arc<Snapshot>>);

impl Collector for DataplaneCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let snapshot = Arc::clone(&self.0.borrow());
        let driver = |name: &str| [("driver", name.to_owned())];
        let stats = &snapshot.stats;
        let a = stats.attachments;
        let mut writes: Vec<_> = stats
            .maps
            .iter()
            .map(|(m, s)| (driver(m), s.writes))
            .collect();
        let mut deletes: Vec<_> = stats
            .maps
            .iter()
            .map(|(m, s)| (driver(m), s.deletes))
            .collect();
        let mut errors: Vec<_> = stats
            .maps
            .iter()
            .map(|(m, s)| (driver(m), s.errors))
            .collect();
        writes.push((driver("tc-attachments"), a.attaches + a.updates));
        deletes.push((driver("tc-attachments"), a.unpins));
        errors.push((driver("tc-attachments"), a.errors));
        counter_family(
            &mut encoder,
            "driver_writes",
            "Kernel writes (map entries written, programs attached or replaced)",
            &writes,
        )?;
        counter_family(
            &mut encoder,
            "driver_deletes",
            "Kernel deletes (map entries deleted, links unpinned)",
            &deletes,
        )?;
        counter_family(&mut encoder, "driver_errors", "Failed applies", &errors)?;
        let repairs: Vec<_> = stats.repairs.iter().map(|(d, n)| (driver(d), *n)).collect();
        counter_family(
            &mut encoder,
            "dataplane_repairs",
            "Drift repaired: kernel state changed from outside (entries, attachments, routes, pins) found and rewritten",
            &repairs,
        )?;
        ConstCounter::new(snapshot.measured.refreshes).encode(encoder.encode_descriptor(
            "dataplane_refreshes",
            "Periodic read-backs of every driver (--refresh-interval)",
            None,
            MetricType::Counter,
        )?)?;
        node_families(&mut encoder, &snapshot.nodes)?;
        let applied = &snapshot.applied;
        ConstGauge::new(i64::from(applied.ready)).encode(encoder.encode_descriptor(
            "ready",
            "1 when the dataplane is in sync",
            None,
            MetricType::Gauge,
        )?)?;
        ConstCounter::new(applied.applies).encode(encoder.encode_descriptor(
            "applies",
            "Apply loop runs",
            None,
            MetricType::Counter,
        )?)?;
        ConstGauge::new(i64::try_from(applied.generation).unwrap_or(i64::MAX)).encode(
            encoder.encode_descriptor(
                "applied_generation",
                "The newest desired-state generation in the kernel",
                None,
                MetricType::Gauge,
            )?,
        )?;
        ConstGauge::new(i64::try_from(snapshot.summary.endpoints).unwrap_or(i64::MAX)).encode(
            encoder.encode_descriptor(
                "endpoints",
                "Registered endpoints",
                None,
                MetricType::Gauge,
            )?,
        )?;
        ConstGauge::new(i64::try_from(snapshot.summary.policy_errors.len()).unwrap_or(i64::MAX))
            .encode(encoder.encode_descriptor(
                "policy_documents_refused",
                "Source documents refused (weir status lists them with file:line and reason)",
                None,
                MetricType::Gauge,
            )?)?;
        Ok(())
    }
}

/// The conntrack sweep's counters.
#[derive(Debug)]
struct ConntrackCollector(Arc<Mutex<CtStats>>);

impl Collector for ConntrackCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let ct = *self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let family = |f: &str| [("family", f.to_owned())];
        let (v4, v6) = (family("ipv4"), family("ipv6"));
        gauge_family(
            &mut encoder,
            "conntrack_entries",
            "Conntrack entries at the last sweep (pressure: divide by capacity)",
            &[(v4.clone(), ct.entries4), (v6.clone(), ct.entries6)],
        )?;
        gauge_family(
            &mut encoder,
            "conntrack_capacity",
            "Conntrack map capacity",
            &[(v4.clone(), ct.max4), (v6.clone(), ct.max6)],
        )?;
        counter_family(
            &mut encoder,
            "conntrack_expired",
            "Expired conntrack entries removed by the sweep",
            &[(v4.clone(), ct.expired4), (v6.clone(), ct.expired6)],
        )?;
        counter_family(
            &mut encoder,
            "conntrack_created",
            "Conntrack entries the programs created (since the map was created)",
            &[(v4.clone(), ct.created4), (v6.clone(), ct.created6)],
        )?;
        counter_family(
            &mut encoder,
            "conntrack_evicted",
            "Conntrack entries the kernel evicted because the LRU map was full (derived at each sweep; full-map insert failures are the ct-insert-failed drop reason)",
            &[(v4.clone(), ct.evicted4), (v6, ct.evicted6)],
        )?;
        gauge_family(
            &mut encoder,
            "service_flow_entries",
            "Translated flows' entries (svc_ct4) at the last sweep (pressure: divide by capacity)",
            &[(v4.clone(), ct.service_flows4)],
        )?;
        gauge_family(
            &mut encoder,
            "service_flow_capacity",
            "Capacity of the translated flows' map (svc_ct4)",
            &[(v4.clone(), ct.service_flows_max4)],
        )?;
        counter_family(
            &mut encoder,
            "service_flows_expired",
            "Translated flows' entries removed by the sweep because their flow left conntrack",
            &[(v4, ct.service_flows_expired4)],
        )
    }
}

/// The NAT map's pressure, as of the last NAT sweep.
#[derive(Debug)]
struct NatCollector(Arc<Mutex<NatStats>>);

impl Collector for NatCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let nat = *self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let family = [("family", "ipv4".to_owned())];
        gauge_family(
            &mut encoder,
            "nat_entries",
            "NAT entries (two per masqueraded flow) after the last sweep (pressure: divide by capacity)",
            &[(family.clone(), nat.entries)],
        )?;
        gauge_family(
            &mut encoder,
            "nat_capacity",
            "NAT map capacity",
            &[(family.clone(), nat.capacity)],
        )?;
        counter_family(
            &mut encoder,
            "nat_swept",
            "Idle NAT entries removed by the sweep",
            &[(family, nat.swept)],
        )?;
        let event = |e: &str| [("event", e.to_owned())];
        counter_family(
            &mut encoder,
            "nat_events",
            "What the programs counted, as of the last sweep: pairs created, port collisions (the next port was tried), flows refused for want of a port, entries the map refused (pressure)",
            &[
                (event("created"), nat.created),
                (event("collision"), nat.collisions),
                (event("exhausted"), nat.exhausted),
                (event("insert-failed"), nat.insert_failed),
            ],
        )
    }
}

/// The programs loaded at start (fixed for the process's life).
#[derive(Debug)]
struct ProgramsCollector(Vec<(String, u32, bool)>);

impl Collector for ProgramsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let mut metric = encoder.encode_descriptor(
            "program_loads",
            "Programs loaded at start (reused: the pinned program was kept)",
            None,
            MetricType::Counter,
        )?;
        for (name, _, reused) in &self.0 {
            let labels = [("program", name.clone()), ("reused", reused.to_string())];
            ConstCounter::new(1u64).encode(metric.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// Apply durations, endpoints by state and the sources' sync state, from the latest snapshot.
#[derive(Debug)]
struct LoopCollector(watch::Receiver<Arc<Snapshot>>);

impl Collector for LoopCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let snapshot = Arc::clone(&self.0.borrow());
        snapshot
            .measured
            .apply_durations
            .encode(encoder.encode_descriptor(
                "dataplane_apply_duration",
                "Durations of the dataplane loop's applies (one per batch that changed anything)",
                Some(&Unit::Seconds),
                MetricType::Histogram,
            )?)?;
        let applied = &snapshot.applied;
        let current = applied.error.is_none() && applied.generation >= snapshot.summary.generation;
        let (mut programmed, mut pending, mut failed) = (0, 0, 0);
        for view in snapshot.endpoints.values() {
            match (view.ifindex, applied.error.is_some(), current) {
                (None, _, _) | (Some(_), false, false) => pending += 1,
                (Some(_), true, _) => failed += 1,
                (Some(_), false, true) => programmed += 1,
            }
        }
        let state = |s: &str| [("state", s.to_owned())];
        gauge_family(
            &mut encoder,
            "endpoints_by_state",
            "Endpoints: programmed (link present, newest state applied), pending (no link yet, or an apply owed), failed (link present, the last apply failed)",
            &[
                (state("programmed"), programmed),
                (state("pending"), pending),
                (state("failed"), failed),
            ],
        )?;
        let sources = snapshot.measured.sources;
        let source = |s: &str| [("source", s.to_owned())];
        gauge_family(
            &mut encoder,
            "source_synced",
            "1 when the source was read and is live: links (the link watcher), cluster (the policy directory or the API server)",
            &[
                (source("links"), u64::from(sources.links)),
                (source("cluster"), u64::from(sources.cluster)),
            ],
        )?;
        counter_family(
            &mut encoder,
            "source_resyncs",
            "Times a source came back in sync after being down (link watcher restarted, API server reachable again)",
            &[
                (source("links"), sources.links_resyncs),
                (source("cluster"), sources.cluster_resyncs),
            ],
        )
    }
}

/// How often the prefilter's deny file was read, applied or refused.
#[derive(Debug)]
struct PrefilterCollector(Arc<crate::sources::prefilter_file::DenyFileReads>);

impl Collector for PrefilterCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        use std::sync::atomic::Ordering::Relaxed;
        let result = |r: &str| [("result", r.to_owned())];
        counter_family(
            &mut encoder,
            "prefilter_deny_file_reads",
            "Reads of --prefilter-deny-file (at start and after each change): applied, or refused with the last good set kept",
            &[
                (result("applied"), self.0.applied.load(Relaxed)),
                (result("refused"), self.0.refused.load(Relaxed)),
            ],
        )
    }
}

/// The IPAM pools' usage, as cached by the IPAM service.
#[derive(Debug)]
struct IpamCollector(PoolUsageCache);

impl Collector for IpamCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let pools = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        // f64: an IPv6 pool's capacity exceeds every integer gauge (2^64 for a /64 is exact).
        let value = |v: u128| v as f64;
        let mut metric = encoder.encode_descriptor(
            "ipam_pool_addresses_allocated",
            "Addresses allocated in the pool (refreshed every 5 s)",
            None,
            MetricType::Gauge,
        )?;
        for p in &pools {
            ConstGauge::new(value(p.allocated))
                .encode(metric.encode_family(&[("pool", p.pool.clone())])?)?;
        }
        let mut metric = encoder.encode_descriptor(
            "ipam_pool_addresses_capacity",
            "Addresses in the pool's CIDR",
            None,
            MetricType::Gauge,
        )?;
        for p in &pools {
            ConstGauge::new(value(p.capacity))
                .encode(metric.encode_family(&[("pool", p.pool.clone())])?)?;
        }
        Ok(())
    }
}

/// The agent's storage: whether the embedded IPAM datastore and the state files are degraded, and
/// how many faults began and cleared.
struct StorageCollector(Arc<crate::calc::ipam_service::IpamService>);

impl std::fmt::Debug for StorageCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StorageCollector")
    }
}

impl Collector for StorageCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let storage = self.0.storage();
        let store = |s: &str| [("store", s.to_owned())];
        let datastore = storage.datastore.clone().unwrap_or_default();
        let (file_faults, file_recoveries) = storage.file_counts;
        gauge_family(
            &mut encoder,
            "storage_degraded",
            "1 while writes fail (a full disk, an I/O error): ipam-datastore (the embedded datastore; allocations are refused), state-files (the state directory's files)",
            &[
                (
                    store("ipam-datastore"),
                    u64::from(storage.datastore_degraded()),
                ),
                (store("state-files"), u64::from(!storage.files.is_empty())),
            ],
        )?;
        counter_family(
            &mut encoder,
            "storage_faults",
            "Storage faults begun (a write failed where the last one succeeded)",
            &[
                (store("ipam-datastore"), datastore.faults),
                (store("state-files"), file_faults),
            ],
        )?;
        counter_family(
            &mut encoder,
            "storage_recoveries",
            "Storage faults that cleared by themselves (a write succeeded again, no restart)",
            &[
                (store("ipam-datastore"), datastore.recoveries),
                (store("state-files"), file_recoveries),
            ],
        )
    }
}

/// What the metrics server reads.
pub struct MetricsState {
    registry: Registry,
    snapshot: watch::Receiver<Arc<Snapshot>>,
}

impl MetricsState {
    /// Builds the registry once: collectors over the loop's snapshots, the conntrack counters
    /// and the programs loaded at start (name, id, reused).
    #[must_use]
    pub fn new(
        snapshot: watch::Receiver<Arc<Snapshot>>,
        ct: Arc<Mutex<CtStats>>,
        nat: Arc<Mutex<NatStats>>,
        programs: Vec<(String, u32, bool)>,
        kernel: Arc<dyn crate::kernel::InspectIo>,
    ) -> Self {
        let mut registry = Registry::with_prefix("weir");
        registry.register_collector(Box::new(DataplaneCollector(snapshot.clone())));
        registry.register_collector(Box::new(LoopCollector(snapshot.clone())));
        registry.register_collector(Box::new(crate::observe::metrics::DatapathCollector {
            snapshot: snapshot.clone(),
            kernel,
        }));
        registry.register_collector(Box::new(ConntrackCollector(ct)));
        registry.register_collector(Box::new(NatCollector(nat)));
        registry.register_collector(Box::new(ProgramsCollector(programs)));
        Self { registry, snapshot }
    }

    /// Adds the prefilter's deny-file read counters.
    #[must_use]
    pub fn with_prefilter(
        mut self,
        reads: Arc<crate::sources::prefilter_file::DenyFileReads>,
    ) -> Self {
        self.registry
            .register_collector(Box::new(PrefilterCollector(reads)));
        self
    }

    /// Adds the IPAM pools' usage, read from `cache` at scrape time.
    #[must_use]
    pub fn with_pool_usage(mut self, cache: PoolUsageCache) -> Self {
        self.registry
            .register_collector(Box::new(IpamCollector(cache)));
        self
    }

    /// Adds the storage gauges and counters (`weir_storage_*`), read from `ipam` at scrape time.
    #[must_use]
    pub fn with_storage(mut self, ipam: Arc<crate::calc::ipam_service::IpamService>) -> Self {
        self.registry
            .register_collector(Box::new(StorageCollector(ipam)));
        self
    }

    /// Every metric in the Prometheus text format (0.0.4).
    pub fn render(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_text::encode(&mut out, &self.registry)?;
        Ok(out)
    }

    /// Every metric in the OpenMetrics text format.
    pub fn render_openmetrics(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

async fn metrics(
    State(state): State<Arc<MetricsState>>,
    headers: HeaderMap,
) -> (StatusCode, [(header::HeaderName, &'static str); 1], String) {
    let openmetrics = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"));
    let (rendered, content_type) = if openmetrics {
        (state.render_openmetrics(), OPENMETRICS)
    } else {
        (state.render(), prometheus_text::CONTENT_TYPE)
    };
    match rendered {
        Ok(text) => (StatusCode::OK, [(header::CONTENT_TYPE, content_type)], text),
        Err(e) => {
            tracing::error!(error = %e, "cannot encode the metrics");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                "cannot encode the metrics; see the agent's log\n".to_owned(),
            )
        }
    }
}

async fn readyz(State(state): State<Arc<MetricsState>>) -> (StatusCode, String) {
    let applied = &state.snapshot.borrow().applied;
    if applied.ready {
        (StatusCode::OK, "ready\n".to_owned())
    } else {
        // Why, when a source says: a stale API server, a link watcher being restarted.
        let why = applied
            .source_error
            .as_deref()
            .map_or_else(String::new, |e| format!(": {e}"));
        (StatusCode::SERVICE_UNAVAILABLE, format!("not ready{why}\n"))
    }
}

/// Serves until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, state: Arc<MetricsState>) {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(state);
    if let Err(e) = axum::serve(listener, app).await {
        tracing::error!(error = %e, "metrics server stopped");
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{
        control::applier::{self, Command},
        inprocess::harness::{self, FakeKernel},
        kernel::LinkEvent,
        synthetic::{self, Sizes},
    };

    async fn wait(rx: &mut watch::Receiver<Arc<Snapshot>>, ok: impl Fn(&Snapshot) -> bool) {
        tokio::time::timeout(Duration::from_secs(30), rx.wait_for(|s| ok(s)))
            .await
            .expect("within 30 s")
            .expect("the loop runs");
    }

    #[tokio::test]
    async fn one_registry_renders_the_latest_snapshot_at_every_scrape() {
        let dir = tempfile::tempdir().expect("tmp");
        let paths = harness::paths(dir.path());
        let sizes = Sizes {
            endpoints: 3,
            namespaces: 1,
            policies: 1,
        };
        synthetic::write(&paths, sizes).expect("sources");
        let kernel = FakeKernel::new();
        let (handle, thread) = applier::spawn(harness::open_node(&paths, &kernel)).expect("loop");
        let ct = Arc::new(Mutex::new(CtStats::default()));
        let nat = Arc::new(Mutex::new(NatStats::default()));
        let state = MetricsState::new(
            handle.subscribe(),
            Arc::clone(&ct),
            Arc::clone(&nat),
            vec![("from_endpoint".into(), 7, true)],
            Arc::new(kernel.fake.clone()),
        );
        let before = state.render().expect("render");
        assert!(before.contains("weir_ready 0"), "{before}");
        for line in [
            r#"weir_endpoints_by_state{state="pending"} 3"#,
            r#"weir_endpoints_by_state{state="programmed"} 0"#,
            r#"weir_source_synced{source="links"} 0"#,
        ] {
            assert!(before.lines().any(|l| l == line), "no {line}:\n{before}");
        }
        assert!(
            before.contains(r#"weir_driver_writes_total{driver="policy_v1"} 0"#),
            "{before}"
        );

        for i in 0..sizes.endpoints {
            let ifname = synthetic::host_ifname(i);
            kernel
                .fake
                .add_link(&ifname, 10 + u32::try_from(i).expect("i"));
            handle
                .send(Command::Link(LinkEvent::Up {
                    ifname,
                    ifindex: 10 + u32::try_from(i).expect("i"),
                    up: true,
                }))
                .expect("send");
        }
        handle.send(Command::Link(LinkEvent::Synced)).expect("send");
        let mut rx = handle.subscribe();
        wait(&mut rx, |s| s.applied.ready).await;
        ct.lock().expect("ct").entries4 = 42;
        {
            let mut nat = nat.lock().expect("nat");
            nat.entries = 20;
            nat.exhausted = 3;
        }
        let after = state.render().expect("render");
        let endpoints = kernel.endpoints.contents().len();
        assert_eq!(endpoints, sizes.endpoints);
        for line in [
            "weir_ready 1".to_owned(),
            format!(r#"weir_driver_writes_total{{driver="endpoints_v1"}} {endpoints}"#),
            r#"weir_driver_writes_total{driver="tc-attachments"} 6"#.to_owned(),
            r#"weir_conntrack_entries{family="ipv4"} 42"#.to_owned(),
            r#"weir_nat_entries{family="ipv4"} 20"#.to_owned(),
            r#"weir_nat_events_total{event="exhausted"} 3"#.to_owned(),
            r#"weir_program_loads_total{program="from_endpoint",reused="true"} 1"#.to_owned(),
            "weir_endpoints 3".to_owned(),
            "weir_policy_documents_refused 0".to_owned(),
            r#"weir_endpoints_by_state{state="programmed"} 3"#.to_owned(),
            r#"weir_endpoints_by_state{state="pending"} 0"#.to_owned(),
            r#"weir_endpoints_by_state{state="failed"} 0"#.to_owned(),
            r#"weir_source_synced{source="links"} 1"#.to_owned(),
            r#"weir_source_synced{source="cluster"} 1"#.to_owned(),
            r#"weir_source_resyncs_total{source="links"} 0"#.to_owned(),
        ] {
            assert!(
                after.lines().any(|l| l == line),
                "/metrics lacks {line}:\n{after}"
            );
        }
        // One observation per apply: the histogram's count is the applies counter.
        let value = |text: &str, name: &str| -> f64 {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
                .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
        };
        let applies = value(&after, "weir_applies_total");
        assert!(applies >= 1.0, "{after}");
        assert!(
            (value(&after, "weir_dataplane_apply_duration_seconds_count") - applies).abs() < 0.5,
            "{after}"
        );
        assert!(value(&after, "weir_dataplane_apply_duration_seconds_sum") > 0.0);
        assert!(
            (value(
                &after,
                r#"weir_dataplane_apply_duration_seconds_bucket{le="+Inf"}"#
            ) - applies)
                .abs()
                < 0.5,
            "{after}"
        );

        // A link watcher that stops is not synced until it syncs again, which counts a resync; so
        // does a cluster source that goes stale and comes back.
        handle
            .send(Command::LinkWatcherDown(
                crate::kernel::LinkWatcherStopped::Ended,
            ))
            .expect("send");
        handle
            .send(Command::SourceStale(Some("unreachable".into())))
            .expect("send");
        wait(&mut rx, |s| {
            !s.measured.sources.links && !s.measured.sources.cluster
        })
        .await;
        let down = state.render().expect("render");
        for line in [
            r#"weir_source_synced{source="links"} 0"#,
            r#"weir_source_synced{source="cluster"} 0"#,
        ] {
            assert!(down.lines().any(|l| l == line), "no {line}:\n{down}");
        }
        handle.send(Command::Link(LinkEvent::Synced)).expect("send");
        handle.send(Command::SourceStale(None)).expect("send");
        wait(&mut rx, |s| {
            s.measured.sources.links && s.measured.sources.cluster
        })
        .await;
        let back = state.render().expect("render");
        for line in [
            r#"weir_source_synced{source="links"} 1"#,
            r#"weir_source_synced{source="cluster"} 1"#,
            r#"weir_source_resyncs_total{source="links"} 1"#,
            r#"weir_source_resyncs_total{source="cluster"} 1"#,
        ] {
            assert!(back.lines().any(|l| l == line), "no {line}:\n{back}");
        }

        // An apply that failed: endpoints on their links count as failed.
        let mut failing = (**rx.borrow()).clone();
        failing.applied.error = Some("injected".into());
        let (_keep, failing_rx) = watch::channel(Arc::new(failing));
        let failing_state = MetricsState::new(
            failing_rx,
            Arc::clone(&ct),
            Arc::clone(&nat),
            Vec::new(),
            Arc::new(kernel.fake.clone()),
        );
        let failed = failing_state.render().expect("render");
        for line in [
            r#"weir_endpoints_by_state{state="failed"} 3"#,
            r#"weir_endpoints_by_state{state="programmed"} 0"#,
        ] {
            assert!(failed.lines().any(|l| l == line), "no {line}:\n{failed}");
        }
        assert!(
            !failed.contains("weir_nodes"),
            "no node families without node records"
        );

        // Nodes by health; a silent one with the seconds since its last heartbeat.
        let mut clustered = (**rx.borrow()).clone();
        let node = |name: &str, health: &str, heartbeat: u64| weir_api::NodeStatus {
            name: name.into(),
            addresses: Vec::new(),
            blocks: Vec::new(),
            routes: 1,
            health: health.into(),
            heartbeat,
            last_seen_secs: None,
            source: weir_api::NodeSource::Etcd,
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs();
        clustered.nodes = Arc::new(vec![
            node("a", "local", now),
            node("b", "alive", now),
            node("c", "silent", now - 100),
        ]);
        let (_keep_nodes, nodes_rx) = watch::channel(Arc::new(clustered));
        let nodes_state = MetricsState::new(
            nodes_rx,
            Arc::clone(&ct),
            Arc::clone(&nat),
            Vec::new(),
            Arc::new(kernel.fake.clone()),
        );
        let with_nodes = nodes_state.render().expect("render");
        for line in [
            r#"weir_nodes{health="local"} 1"#,
            r#"weir_nodes{health="alive"} 1"#,
            r#"weir_nodes{health="silent"} 1"#,
        ] {
            assert!(
                with_nodes.lines().any(|l| l == line),
                "no {line}:\n{with_nodes}"
            );
        }
        let silent_for: u64 = with_nodes
            .lines()
            .find_map(|l| l.strip_prefix(r#"weir_node_silent_seconds{node="c"} "#))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no silent seconds for c:\n{with_nodes}"));
        assert!((100..200).contains(&silent_for), "{silent_for}");
        assert!(!with_nodes.contains(r#"weir_node_silent_seconds{node="b"}"#));

        // A refused document of the source is counted (and listed by `weir status`).
        let (set, errors) = crate::calc::policy::load::load_dir(&paths.policy_dir);
        let refused = crate::calc::policy::load::PolicyFileError {
            file: paths.policy_dir.join("bad.yaml"),
            line: 3,
            reason: "not valid YAML".to_owned(),
        };
        assert!(errors.is_empty(), "{errors:?}");
        handle
            .send(Command::Policies {
                set,
                errors: vec![refused],
            })
            .expect("send");
        wait(&mut rx, |s| s.summary.policy_errors.len() == 1).await;
        let refusing = state.render().expect("render");
        assert!(
            refusing
                .lines()
                .any(|l| l == "weir_policy_documents_refused 1"),
            "{refusing}"
        );
        handle.stop();
        thread.join().expect("join");
    }

    #[tokio::test]
    async fn pool_usage_is_rendered_per_pool_and_both_formats_are_served() {
        let dir = tempfile::tempdir().expect("tmp");
        let paths = harness::paths(dir.path());
        synthetic::write(
            &paths,
            Sizes {
                endpoints: 1,
                namespaces: 1,
                policies: 1,
            },
        )
        .expect("sources");
        let kernel = FakeKernel::new();
        let (handle, thread) = applier::spawn(harness::open_node(&paths, &kernel)).expect("loop");
        let cache = PoolUsageCache::default();
        let state = MetricsState::new(
            handle.subscribe(),
            Arc::default(),
            Arc::default(),
            Vec::new(),
            Arc::new(kernel.fake.clone()),
        )
        .with_pool_usage(Arc::clone(&cache));
        let empty = state.render().expect("render");
        assert!(
            empty.contains("# TYPE weir_ipam_pool_addresses_allocated gauge")
                && !empty.contains("weir_ipam_pool_addresses_allocated{"),
            "{empty}"
        );
        *cache.lock().expect("cache") = vec![
            PoolUsage {
                pool: "default-ipv4".into(),
                allocated: 3,
                capacity: 65_536,
            },
            PoolUsage {
                pool: "default-ipv6".into(),
                allocated: 2,
                capacity: 1 << 64,
            },
        ];
        let text = state.render().expect("render");
        let value = |line: &str| -> f64 {
            text.lines()
                .find_map(|l| l.strip_prefix(line)?.strip_prefix(' ')?.parse().ok())
                .unwrap_or_else(|| panic!("no {line} in:\n{text}"))
        };
        assert_eq!(
            value(r#"weir_ipam_pool_addresses_allocated{pool="default-ipv4"}"#),
            3.0
        );
        assert_eq!(
            value(r#"weir_ipam_pool_addresses_capacity{pool="default-ipv4"}"#),
            65_536.0
        );
        assert_eq!(
            value(r#"weir_ipam_pool_addresses_capacity{pool="default-ipv6"}"#),
            2f64.powi(64)
        );
        // The Prometheus text format: a counter's TYPE names its samples (`_total`), no `# EOF`;
        // OpenMetrics names the family without the suffix and ends with `# EOF`.
        assert!(
            text.contains("# TYPE weir_applies_total counter") && !text.contains("# EOF"),
            "{text}"
        );
        let open = state.render_openmetrics().expect("render");
        assert!(
            open.contains("# TYPE weir_applies counter") && open.trim_end().ends_with("# EOF"),
            "{open}"
        );
        handle.stop();
        thread.join().expect("join");
    }
}
