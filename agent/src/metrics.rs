//! Metrics and health on `--metrics` (127.0.0.1:9972): `/metrics` (Prometheus text, built at
//! scrape time from the drivers' counters), `/healthz`, `/readyz`.

use std::sync::Arc;

use axum::{Router, extract::State, http::StatusCode, routing::get};
use prometheus_client::{
    encoding::text::encode,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use crate::applier::Shared;

type Labels = Vec<(String, String)>;

fn render(
    shared: &Shared,
    ct: &crate::dataplane::conntrack::CtStats,
    programs: &[(String, u32, bool)],
    paths: &crate::paths::Paths,
) -> String {
    let mut registry = Registry::with_prefix("weir");
    let writes = Family::<Labels, Counter>::default();
    let deletes = Family::<Labels, Counter>::default();
    let errors = Family::<Labels, Counter>::default();
    let stats = shared.lock().dataplane.stats();
    for (map, s) in &stats.maps {
        let l = vec![("driver".to_owned(), map.clone())];
        writes.get_or_create(&l).inc_by(s.writes);
        deletes.get_or_create(&l).inc_by(s.deletes);
        errors.get_or_create(&l).inc_by(s.errors);
    }
    let a = stats.attachments;
    let l = vec![("driver".to_owned(), "tc-attachments".to_owned())];
    writes.get_or_create(&l).inc_by(a.attaches + a.updates);
    deletes.get_or_create(&l).inc_by(a.unpins);
    errors.get_or_create(&l).inc_by(a.errors);
    registry.register(
        "driver_writes",
        "Kernel writes (map entries written, programs attached or replaced)",
        writes,
    );
    registry.register(
        "driver_deletes",
        "Kernel deletes (map entries deleted, links unpinned)",
        deletes,
    );
    registry.register("driver_errors", "Failed applies", errors);
    let applied = shared.applied();
    let ready = Gauge::<i64>::default();
    ready.set(i64::from(applied.ready));
    registry.register("ready", "1 when the dataplane is in sync", ready);
    let applies = Counter::<u64>::default();
    applies.inc_by(applied.applies);
    registry.register("applies", "Apply loop runs", applies);
    let ct_entries = Family::<Labels, Gauge<i64>>::default();
    let ct_capacity = Family::<Labels, Gauge<i64>>::default();
    let ct_expired = Family::<Labels, Counter>::default();
    let ct_created = Family::<Labels, Counter>::default();
    let ct_evicted = Family::<Labels, Counter>::default();
    for (family, entries, max, expired, created, evicted) in [
        (
            "ipv4",
            ct.entries4,
            ct.max4,
            ct.expired4,
            ct.created4,
            ct.evicted4,
        ),
        (
            "ipv6",
            ct.entries6,
            ct.max6,
            ct.expired6,
            ct.created6,
            ct.evicted6,
        ),
    ] {
        let l = vec![("family".to_owned(), family.to_owned())];
        ct_entries
            .get_or_create(&l)
            .set(i64::try_from(entries).unwrap_or(i64::MAX));
        ct_capacity
            .get_or_create(&l)
            .set(i64::try_from(max).unwrap_or(i64::MAX));
        ct_expired.get_or_create(&l).inc_by(expired);
        ct_created.get_or_create(&l).inc_by(created);
        ct_evicted.get_or_create(&l).inc_by(evicted);
    }
    registry.register(
        "conntrack_entries",
        "Conntrack entries at the last sweep (pressure: divide by capacity)",
        ct_entries,
    );
    registry.register("conntrack_capacity", "Conntrack map capacity", ct_capacity);
    registry.register(
        "conntrack_expired",
        "Expired conntrack entries removed by the sweep",
        ct_expired,
    );
    registry.register(
        "conntrack_created",
        "Conntrack entries the programs created (since the map was created)",
        ct_created,
    );
    registry.register(
        "conntrack_evicted",
        "Conntrack entries the kernel evicted because the LRU map was full (derived at each sweep; full-map insert failures are the ct-insert-failed drop reason)",
        ct_evicted,
    );
    let loads = Family::<Labels, Counter>::default();
    for (name, _, reused) in programs {
        let l = vec![
            ("program".to_owned(), name.clone()),
            ("reused".to_owned(), reused.to_string()),
        ];
        loads.get_or_create(&l).inc();
    }
    registry.register(
        "program_loads",
        "Programs loaded at start (reused: the pinned program was kept)",
        loads,
    );
    crate::observe::metrics::collect(&mut registry, shared, paths);
    let mut out = String::new();
    if encode(&mut out, &registry).is_err() {
        out.clear();
    }
    out
}

async fn metrics(State(state): State<Arc<MetricsState>>) -> String {
    let ct = *state
        .ct
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    render(&state.shared, &ct, &state.programs, &state.paths)
}

async fn readyz(State(state): State<Arc<MetricsState>>) -> (StatusCode, &'static str) {
    if state.shared.applied().ready {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}

/// What the metrics server reads.
pub struct MetricsState {
    /// Node state and applier.
    pub shared: Arc<Shared>,
    /// Conntrack sweep counters.
    pub ct: Arc<std::sync::Mutex<crate::dataplane::conntrack::CtStats>>,
    /// Programs loaded at start: (name, id, reused).
    pub programs: Vec<(String, u32, bool)>,
    /// Pins (the datapath counters are read from them at scrape time).
    pub paths: crate::paths::Paths,
}

/// Serves until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, shared: Arc<MetricsState>) {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(shared);
    if let Err(e) = axum::serve(listener, app).await {
        tracing::error!(error = %e, "metrics server stopped");
    }
}
