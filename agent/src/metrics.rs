//! Metrics and health on `--metrics` (127.0.0.1:9972): `/metrics` (Prometheus text), `/healthz`,
//! `/readyz`. The registry is built once; its collectors read the snapshot the dataplane loop
//! published last and the conntrack sweep's counters at scrape time.

use std::sync::{Arc, Mutex, PoisonError};

use axum::{Router, extract::State, http::StatusCode, routing::get};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _, text::encode},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
    registry::Registry,
};
use tokio::sync::watch;

use crate::{
    dataplane::{conntrack::CtStats, nat_stats::NatStats},
    snapshot::Snapshot,
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

/// The NAT map's pressure, as of the masquerade thread's last sweep.
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

/// How often the prefilter's deny file was read, applied or refused.
#[derive(Debug)]
struct PrefilterCollector(Arc<crate::dataplane::prefilter::DenyFileReads>);

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
        kernel: Arc<dyn crate::dataplane::kernel::InspectIo>,
    ) -> Self {
        let mut registry = Registry::with_prefix("weir");
        registry.register_collector(Box::new(DataplaneCollector(snapshot.clone())));
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
        reads: Arc<crate::dataplane::prefilter::DenyFileReads>,
    ) -> Self {
        self.registry
            .register_collector(Box::new(PrefilterCollector(reads)));
        self
    }

    /// The Prometheus text of every metric.
    pub fn render(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

async fn metrics(State(state): State<Arc<MetricsState>>) -> (StatusCode, String) {
    match state.render() {
        Ok(text) => (StatusCode::OK, text),
        Err(e) => {
            tracing::error!(error = %e, "cannot encode the metrics");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
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
        applier::{self, Command},
        inprocess::harness::{self, FakeKernel},
        sources::linkwatch::LinkEvent,
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
        ] {
            assert!(
                after.lines().any(|l| l == line),
                "/metrics lacks {line}:\n{after}"
            );
        }
        // A refused document of the source is counted (and listed by `weir status`).
        let (set, errors) = crate::policy::load::load_dir(&paths.policy_dir);
        let refused = crate::policy::load::PolicyFileError {
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
}
