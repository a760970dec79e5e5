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

fn render(shared: &Shared) -> String {
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
    let mut out = String::new();
    if encode(&mut out, &registry).is_err() {
        out.clear();
    }
    out
}

async fn metrics(State(shared): State<Arc<Shared>>) -> String {
    render(&shared)
}

async fn readyz(State(shared): State<Arc<Shared>>) -> (StatusCode, &'static str) {
    if shared.applied().ready {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}

/// Serves until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, shared: Arc<Shared>) {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(shared);
    if let Err(e) = axum::serve(listener, app).await {
        tracing::error!(error = %e, "metrics server stopped");
    }
}
