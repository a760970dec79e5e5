//! The whole `/metrics` of a real agent with two pods passes `promtool check metrics` (Debian's
//! `prometheus` package), and carries the series of issue 38 with plausible values: IPAM pool usage,
//! apply durations, endpoints by state, the sources' sync state. Controls: promtool refuses a
//! malformed exposition and the OpenMetrics body (which it cannot lint), so the check can fail.

use std::{
    io::{Read as _, Write as _},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use tests::{
    agent_proc::metrics_get,
    netns::NetNs,
    observe::{node_and_agent, pod, start_agent},
    privileged::require_root,
};

const PROMTOOL: &str = "/usr/bin/promtool";

/// `promtool check metrics` on `text`: success, and what it printed.
fn promtool(text: &str) -> (bool, String) {
    let mut child = Command::new(PROMTOOL)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write to promtool");
    let out = child.wait_with_output().expect("promtool ends");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

/// The response's head and body.
fn split(response: &str) -> (&str, &str) {
    response
        .split_once("\r\n\r\n")
        .expect("an HTTP response with a body")
}

/// `/metrics` asking for OpenMetrics, as Prometheus does (call inside the agent's namespace).
fn openmetrics_get() -> String {
    let mut s = std::net::TcpStream::connect("127.0.0.1:9972").expect("metrics port");
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: weir\r\nAccept: application/openmetrics-text;version=1.0.0\r\nConnection: close\r\n\r\n"
    )
    .expect("request");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("response");
    out
}

/// Every sample of `name` (`name{labels} value` or `name value`): (labels, value).
fn samples(body: &str, name: &str) -> Vec<(String, f64)> {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let labels = series.strip_prefix(name)?;
            (labels.is_empty() || labels.starts_with('{'))
                .then(|| (labels.to_owned(), value.parse().expect("a number")))
        })
        .collect()
}

fn value(body: &str, name: &str, labels: &str) -> f64 {
    samples(body, name)
        .into_iter()
        .find(|(l, _)| l == labels)
        .unwrap_or_else(|| panic!("no {name}{labels} in:\n{body}"))
        .1
}

/// Scrapes until `ok` holds (the pool usage is refreshed every 5 s); bounded at 30 s.
fn scrape_until(node: &NetNs, ok: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let body = split(&node.run(|| metrics_get("/metrics"))).1.to_owned();
        if ok(&body) {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "/metrics did not show the pods within 30 s:\n{body}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn the_whole_metrics_page_passes_promtool_and_has_the_new_series() {
    if !require_root("the_whole_metrics_page_passes_promtool_and_has_the_new_series") {
        return;
    }
    if !std::path::Path::new(PROMTOOL).is_file() {
        assert!(
            std::env::var_os("CI").is_none(),
            "{PROMTOOL} is missing under CI: install Debian's prometheus package (cargo xtask setup)"
        );
        eprintln!("skipping test - {PROMTOOL} is missing");
        return;
    }
    // Controls first: promtool fails on a malformed line, and on a counter without help text.
    let (ok, said) = promtool("# HELP weir_ready Ready.\n# TYPE weir_ready gauge\nweir_ready{ 1\n");
    assert!(!ok, "promtool accepted a malformed exposition: {said}");
    let (ok, said) = promtool("# TYPE weir_x counter\nweir_x_total 1\n");
    assert!(!ok, "promtool accepted a counter without help text: {said}");

    let (root, dirs, node) = node_and_agent();
    let agent = start_agent(&root, &dirs, &node);
    let pods = [
        pod(&node, &agent, "web", "web"),
        pod(&node, &agent, "client", "client"),
    ];
    let n = f64::from(u8::try_from(pods.len()).expect("a few pods"));
    let body = scrape_until(&node, |body| {
        let allocated = samples(body, "weir_ipam_pool_addresses_allocated");
        allocated.len() >= 2
            && allocated.iter().all(|(_, v)| *v >= n)
            && samples(body, "weir_endpoints_by_state")
                .iter()
                .any(|(l, v)| l == r#"{state="programmed"}"# && *v == n)
    });

    // The head says which format the body is in; promtool passes the whole body.
    let response = node.run(|| metrics_get("/metrics"));
    let (head, _) = split(&response);
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    let (ok, said) = promtool(&body);
    assert!(
        ok,
        "promtool check metrics failed on /metrics: {said}\n{body}"
    );

    // IPAM: one series per pool (the IPv4 /16 and the IPv6 /64), each holding the pods' addresses.
    let capacity = samples(&body, "weir_ipam_pool_addresses_capacity");
    let mut sizes: Vec<f64> = capacity.iter().map(|(_, v)| *v).collect();
    sizes.sort_by(f64::total_cmp);
    assert_eq!(sizes, [65_536.0, 2f64.powi(64)], "{capacity:?}");
    for (labels, allocated) in samples(&body, "weir_ipam_pool_addresses_allocated") {
        assert!(labels.starts_with("{pool=\""), "{labels}");
        let cap = value(&body, "weir_ipam_pool_addresses_capacity", &labels);
        assert!(
            allocated >= n && allocated <= cap,
            "{labels}: {allocated} of {cap}"
        );
    }
    // Apply durations: one observation per apply, every one within the last bucket.
    let applies = value(&body, "weir_applies_total", "");
    let count = value(&body, "weir_dataplane_apply_duration_seconds_count", "");
    assert!(
        applies >= 1.0 && count == applies,
        "{count} observations, {applies} applies"
    );
    assert_eq!(
        value(
            &body,
            "weir_dataplane_apply_duration_seconds_bucket",
            r#"{le="+Inf"}"#
        ),
        count
    );
    let sum = value(&body, "weir_dataplane_apply_duration_seconds_sum", "");
    assert!(
        sum > 0.0 && sum < 60.0 * count,
        "{sum} s over {count} applies"
    );
    // Endpoints by state: both pods programmed, none pending or failed.
    assert_eq!(
        value(&body, "weir_endpoints_by_state", r#"{state="pending"}"#),
        0.0
    );
    assert_eq!(
        value(&body, "weir_endpoints_by_state", r#"{state="failed"}"#),
        0.0
    );
    // Sources: both in sync, neither came back from being down.
    for source in ["links", "cluster"] {
        let labels = format!("{{source=\"{source}\"}}");
        assert_eq!(value(&body, "weir_source_synced", &labels), 1.0, "{source}");
        assert_eq!(
            value(&body, "weir_source_resyncs_total", &labels),
            0.0,
            "{source}"
        );
    }

    // A Prometheus server asks for OpenMetrics and gets it; promtool cannot lint that format (its
    // counters' samples do not carry the family's name), which is why plain scrapers get the other.
    let open = node.run(openmetrics_get);
    let (head, open_body) = split(&open);
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/openmetrics-text"),
        "{head}"
    );
    assert!(open_body.trim_end().ends_with("# EOF"), "{open_body}");
    let (ok, _) = promtool(open_body);
    assert!(
        !ok,
        "promtool passed the OpenMetrics body: the check cannot tell the formats apart"
    );

    drop(pods);
    assert!(agent.terminate().success(), "the agent stops cleanly");
}
