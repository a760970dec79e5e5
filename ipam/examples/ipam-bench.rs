//! The IPAM benchmark behind `cargo xtask bench ipam`: prints one flat JSON object of figures on stdout.
//!
//! `ipam-bench [--smoke] [--only a|b|c|d] --weir PATH`: (a) embedded store, one host, 8 clients allocate+release, and one client
//! alone; (b) etcd, one host, 8 clients; (c) 1, 8 and 32 hosts at once on etcd, with duplicates counted;
//! (d) `weir ipam allocate` + `release` processes against Debian's host-local ADD + DEL: through the agent on
//! `--agent-socket` (which holds `--agent-datastore`) and, without it, on a file of their own; through the agent
//! and host-local run interleaved over 3 rounds, `cli_over_hostlocal` the median of the rounds' ratios;
//! (e) 200 allocations at once through the agent's API (`POST /v1/ipam/allocate`), three bursts.
//! Every write is durable: redb commits with `Durability::Immediate` (group commit), etcd fsyncs as configured.

use std::{
    collections::BTreeSet,
    io::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use ipam::{
    AssignArgs, Ipam,
    model::{IpPool, IpUse, ReleaseCheck},
    store::{
        Store,
        embedded::{EmbeddedStore, Sharing},
        etcd::EtcdStore,
    },
    testing::EtcdServer,
};
use serde_json::{Map, Value, json};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn pool(cidr: &str) -> IpPool {
    IpPool {
        name: "bench".into(),
        cidr: cidr.parse().unwrap_or_else(|_| std::process::abort()),
        block_size: 26,
        node_selector: String::new(),
        namespace_selector: String::new(),
        allowed_uses: vec![IpUse::Workload],
        disabled: false,
    }
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

/// `clients` tasks on one host, each allocating then releasing, `total` allocations in all.
/// Returns (allocations per second, p50 ms, p99 ms) of the allocations.
async fn churn<S: Store + Clone>(
    ipam: &Ipam<S>,
    clients: usize,
    total: usize,
) -> Res<(f64, f64, f64)> {
    let per = total / clients;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let ipam = ipam.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(per);
            for i in 0..per {
                let t = Instant::now();
                let r = ipam
                    .auto_assign(&AssignArgs::new("bench-host", &format!("c{c}-{i}"), 1, 0))
                    .await?;
                lat.push(t.elapsed());
                let ip = r.ips().first().copied().ok_or("pool exhausted")?;
                ipam.release_ips(&[(ip, ReleaseCheck::default())]).await?;
            }
            Res::Ok(lat)
        }));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await??);
    }
    let secs = start.elapsed().as_secs_f64();
    lat.sort();
    Ok((
        (per * clients) as f64 / secs,
        percentile(&lat, 0.5),
        percentile(&lat, 0.99),
    ))
}

/// `hosts` hosts allocating `per_host` each at once; returns (allocations per second, duplicates).
async fn hosts_at_once(ipam: &Ipam<EtcdStore>, hosts: usize, per_host: usize) -> Res<(f64, usize)> {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for h in 0..hosts {
        let ipam = ipam.clone();
        tasks.push(tokio::spawn(async move {
            let mut ips = Vec::new();
            for i in 0..per_host {
                let r = ipam
                    .auto_assign(&AssignArgs::new(
                        &format!("node{h}"),
                        &format!("n{h}-{i}"),
                        1,
                        0,
                    ))
                    .await?;
                ips.extend(r.ips());
            }
            Res::Ok(ips)
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    let secs = start.elapsed().as_secs_f64();
    let distinct: BTreeSet<_> = all.iter().collect();
    Ok((all.len() as f64 / secs, all.len() - distinct.len()))
}

async fn etcd_ipam() -> Res<(EtcdServer, Ipam<EtcdStore>)> {
    let server = EtcdServer::start()?;
    let ipam = Ipam::new(EtcdStore::connect(&[server.url().to_owned()]).await?);
    ipam.add_pool(pool("10.0.0.0/12")).await?;
    Ok((server, ipam))
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// etcd's `etcd_disk_wal_fsync_duration_seconds` histogram from its `/metrics`: (upper bound s, cumulative count).
fn wal_fsync(url: &str) -> Res<Vec<(f64, f64)>> {
    use std::io::Read as _;
    let addr = url.trim_start_matches("http://").trim_end_matches('/');
    let mut conn = std::net::TcpStream::connect(addr)?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(conn, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut body = String::new();
    conn.read_to_string(&mut body)?;
    let mut buckets = Vec::new();
    for line in body.lines() {
        let Some(rest) = line.strip_prefix("etcd_disk_wal_fsync_duration_seconds_bucket{le=\"")
        else {
            continue;
        };
        let Some((le, count)) = rest.split_once("\"} ") else {
            continue;
        };
        let le = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse()?
        };
        buckets.push((le, count.trim().parse()?));
    }
    if buckets.is_empty() {
        return Err("etcd's /metrics has no etcd_disk_wal_fsync_duration_seconds histogram".into());
    }
    Ok(buckets)
}

/// The `q` quantile (seconds) of the observations between two readings of a histogram, interpolated linearly
/// inside the bucket as Prometheus' `histogram_quantile` does.
fn histogram_quantile(before: &[(f64, f64)], after: &[(f64, f64)], q: f64) -> f64 {
    let delta: Vec<(f64, f64)> = after
        .iter()
        .map(|(le, n)| {
            let was = before
                .iter()
                .find(|(b, _)| b == le)
                .map_or(0.0, |(_, n)| *n);
            (*le, n - was)
        })
        .collect();
    let total = delta.last().map_or(0.0, |(_, n)| *n);
    if total <= 0.0 {
        return 0.0;
    }
    let rank = q * total;
    let (mut lower, mut below) = (0.0, 0.0);
    for (le, n) in delta {
        if n >= rank {
            if le.is_infinite() {
                return lower;
            }
            return lower + (le - lower) * (rank - below) / (n - below).max(f64::MIN_POSITIVE);
        }
        (lower, below) = (le, n);
    }
    lower
}

/// Runs `ops` operations of `op` on `threads` threads; returns operations per second.
/// Rounds of (d)'s comparison, through the agent then host-local in each (odd: the median is a round's).
const D_ROUNDS: usize = 3;

fn processes(
    ops: usize,
    threads: usize,
    op: Arc<dyn Fn(usize) -> Res<()> + Send + Sync>,
) -> Res<f64> {
    let start = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let op = Arc::clone(&op);
            std::thread::spawn(move || -> Res<()> {
                for i in (t..ops).step_by(threads) {
                    op(i)?;
                }
                Ok(())
            })
        })
        .collect();
    for h in handles {
        h.join().map_err(|_| "worker panicked")??;
    }
    Ok(ops as f64 / start.elapsed().as_secs_f64())
}

fn run_ok(cmd: &mut Command, stdin: Option<&[u8]>) -> Res<()> {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::piped())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
    let mut child = cmd.spawn()?;
    if let (Some(data), Some(mut s)) = (stdin, child.stdin.take()) {
        s.write_all(data)?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        return Err(format!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(())
}

/// `weir ipam allocate` + `release` processes on `ds` (through the agent on `socket` when it holds `ds`).
/// `weir ipam pool add` of the pool [`cli_processes`] allocates from.
fn cli_pool(weir: &Path, ds: &str, socket: &str) -> Res<()> {
    run_ok(
        Command::new(weir).args([
            "ipam",
            "pool",
            "add",
            "bench",
            "--cidr",
            "10.64.0.0/16",
            "--datastore",
            ds,
            "--api-socket",
            socket,
        ]),
        None,
    )
}

fn cli_processes(weir: &Path, ds: &str, socket: &str, ops: usize, threads: usize) -> Res<f64> {
    let (w, d, s) = (weir.to_owned(), ds.to_owned(), socket.to_owned());
    let weir_op = Arc::new(move |i: usize| -> Res<()> {
        let h = format!("c{i}");
        run_ok(
            Command::new(&w).args([
                "ipam",
                "allocate",
                "--host",
                "bench",
                "--handle",
                &h,
                "--pool",
                "bench",
                "--datastore",
                &d,
                "--api-socket",
                &s,
            ]),
            None,
        )?;
        run_ok(
            Command::new(&w).args([
                "ipam",
                "release",
                "--handle",
                &h,
                "--datastore",
                &d,
                "--api-socket",
                &s,
            ]),
            None,
        )
    });
    processes(ops, threads, weir_op)
}

fn host_local(dir: &Path, ops: usize, threads: usize) -> Res<f64> {
    let data_dir: PathBuf = dir.join("host-local");
    let conf = json!({
        "cniVersion": "0.4.0",
        "name": "wtbench",
        "ipam": { "type": "host-local", "subnet": "10.65.0.0/16", "dataDir": data_dir }
    })
    .to_string();
    let plugin = PathBuf::from(
        std::env::var("WEIR_HOST_LOCAL").unwrap_or_else(|_| "/usr/lib/cni/host-local".into()),
    );
    let hl_op = Arc::new(move |i: usize| -> Res<()> {
        for verb in ["ADD", "DEL"] {
            let mut c = Command::new(&plugin);
            c.env("CNI_COMMAND", verb)
                .env("CNI_CONTAINERID", format!("c{i}"))
                .env("CNI_NETNS", "/var/run/netns/wtbench")
                .env("CNI_IFNAME", "eth0")
                .env("CNI_PATH", "/usr/lib/cni");
            run_ok(&mut c, Some(conf.as_bytes()))?;
        }
        Ok(())
    });
    processes(ops, threads, hl_op)
}

/// One HTTP/1.1 request on the agent's socket; returns the status code and body.
async fn agent_call(socket: &str, method: &str, path: &str, body: &str) -> Res<(u16, String)> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut conn = tokio::net::UnixStream::connect(socket).await?;
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: weir\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(request.as_bytes()).await?;
    let mut answer = String::new();
    conn.read_to_string(&mut answer).await?;
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or("the agent's answer has no status line")?;
    let body = answer
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    Ok((status, body))
}

/// `n` allocations sent at once to the agent's API; returns the seconds until the last answer (every one must
/// succeed, with distinct addresses), then releases them.
async fn agent_burst(socket: &str, burst: usize, n: usize) -> Res<f64> {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..n {
        let socket = socket.to_owned();
        tasks.push(tokio::spawn(async move {
            let body = json!({"handle": format!("burst{burst}-{i}"), "ipv4": 1}).to_string();
            agent_call(&socket, "POST", "/v1/ipam/allocate", &body).await
        }));
    }
    let mut ips = BTreeSet::new();
    for t in tasks {
        let (status, body) = t.await??;
        if status != 200 {
            return Err(format!("allocation failed ({status}): {body}").into());
        }
        let v: Value = serde_json::from_str(&body)?;
        ips.insert(v["ips"][0].as_str().unwrap_or_default().to_owned());
    }
    let secs = start.elapsed().as_secs_f64();
    if ips.len() != n {
        return Err(format!("{n} allocations returned {} distinct addresses", ips.len()).into());
    }
    for i in 0..n {
        let body = json!({"handle": format!("burst{burst}-{i}")}).to_string();
        let (status, body) = agent_call(socket, "POST", "/v1/ipam/release", &body).await?;
        if status != 200 {
            return Err(format!("release failed ({status}): {body}").into());
        }
    }
    Ok(secs)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    let smoke = args.iter().any(|a| a == "--smoke");
    let weir = args
        .iter()
        .position(|a| a == "--weir")
        .and_then(|i| args.get(i + 1))
        .map(PathBuf::from);
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .cloned();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let agent = flag("--agent-socket").zip(flag("--agent-datastore"));
    let part = |p: &str| only.as_deref().is_none_or(|o| o == p);
    let (a_total, b_total, c_per_host, d_ops) = if smoke {
        (400, 80, 4, 16)
    } else {
        (8_000, 2_000, 50, 200)
    };
    let mut out = Map::new();
    let dir = tempfile::tempdir()?;

    // (a) embedded, one host: the file held as the agent holds it (exclusive), then shared (as `weir ipam`
    // processes without an agent share it).
    if part("a") {
        for (sharing, tag) in [
            (Sharing::Exclusive, "embedded"),
            (Sharing::Shared, "embedded_shared"),
        ] {
            let path = dir.path().join(format!("{tag}.redb"));
            let store = EmbeddedStore::open_with(&path, Duration::from_secs(5), sharing)?;
            let ipam = Ipam::new(store.clone());
            ipam.add_pool(pool("10.0.0.0/12")).await?;
            let before = store.commit_stats();
            let (aps, p50, p99) = churn(&ipam, 8, a_total).await?;
            let after = store.commit_stats();
            let per_commit = (after.writes - before.writes) as f64
                / (after.commits - before.commits).max(1) as f64;
            out.insert(format!("{tag}_allocs_per_s"), json!(aps.round()));
            out.insert(format!("{tag}_p50_ms"), json!(p50));
            out.insert(format!("{tag}_p99_ms"), json!(p99));
            out.insert(
                format!("{tag}_writes_per_commit"),
                json!((per_commit * 100.0).round() / 100.0),
            );
            if sharing == Sharing::Exclusive {
                let (_, sp50, sp99) = churn(&ipam, 1, a_total / 10).await?;
                out.insert("embedded_seq_p50_ms".into(), json!(sp50));
                out.insert("embedded_seq_p99_ms".into(), json!(sp99));
            }
        }
    }

    // (b) etcd, one host, 8 clients; etcd's own WAL fsync latency over the same run, from its /metrics; where
    // the read-modify-writes spent their time.
    if part("b") {
        let (server, ipam) = etcd_ipam().await?;
        let (fsync_before, stats_before) = (wal_fsync(server.url())?, ipam.store().stats());
        let (aps, p50, p99) = churn(&ipam, 8, b_total).await?;
        let (fsync_after, s) = (wal_fsync(server.url())?, ipam.store().stats());
        out.insert("etcd_allocs_per_s".into(), json!(aps.round()));
        out.insert("etcd_p50_ms".into(), json!(p50));
        out.insert("etcd_p99_ms".into(), json!(p99));
        out.insert(
            "etcd_wal_fsync_p99_ms".into(),
            json!(round3(
                histogram_quantile(&fsync_before, &fsync_after, 0.99) * 1e3
            )),
        );
        out.insert(
            "etcd_wal_fsync_p50_ms".into(),
            json!(round3(
                histogram_quantile(&fsync_before, &fsync_after, 0.5) * 1e3
            )),
        );
        let d = |a: u64, b: u64| (a - b) as f64;
        let (jobs, rounds) = (
            d(s.jobs, stats_before.jobs).max(1.0),
            d(s.rounds, stats_before.rounds).max(1.0),
        );
        let reads = d(s.reads, stats_before.reads).max(1.0);
        let allocs = b_total as f64;
        let p99 = ipam.store().percentiles(0.99);
        for (key, value) in [
            ("etcd_write_p99_ms", p99.write_ms),
            ("etcd_read_txn_p99_ms", p99.read_txn_ms),
            ("etcd_cas_txn_p99_ms", p99.cas_txn_ms),
            ("etcd_writes_per_round", jobs / rounds),
            (
                "etcd_queue_ms_per_write",
                d(s.queued_ns, stats_before.queued_ns) / jobs / 1e6,
            ),
            (
                "etcd_read_txn_ms_per_round",
                d(s.read_ns, stats_before.read_ns) / rounds / 1e6,
            ),
            (
                "etcd_cas_txn_ms_per_round",
                d(s.cas_ns, stats_before.cas_ns) / rounds / 1e6,
            ),
            (
                "etcd_cas_txns_per_round",
                d(s.cas_txns, stats_before.cas_txns) / rounds,
            ),
            (
                "etcd_cas_lost_per_round",
                d(s.lost, stats_before.lost) / rounds,
            ),
            ("etcd_reads_per_alloc", reads / allocs),
            (
                "etcd_read_ms",
                d(s.reads_ns, stats_before.reads_ns) / reads / 1e6,
            ),
        ] {
            out.insert(key.into(), json!(round3(value)));
        }
        drop((ipam, server));
    }

    // (c) 1, 8, 32 hosts at once, each on a fresh etcd.
    for hosts in [1usize, 8, 32].into_iter().filter(|_| part("c")) {
        let (server, ipam) = etcd_ipam().await?;
        let (aps, dups) =
            hosts_at_once(&ipam, hosts, c_per_host * if hosts == 1 { 8 } else { 1 }).await?;
        out.insert(format!("etcd{hosts}_allocs_per_s"), json!(aps.round()));
        out.insert(format!("etcd{hosts}_duplicates"), json!(dups));
        drop((ipam, server));
    }

    // (e) a node starting many pods at once: allocations through the agent's API.
    if let Some((socket, _)) = agent.as_ref().filter(|_| part("e")) {
        let n = if smoke { 20 } else { 200 };
        agent_burst(socket, 0, 1).await?; // the agent's first block claimed, its datastore warm
        let mut runs = Vec::new();
        for burst in 1..=3 {
            runs.push(agent_burst(socket, burst, n).await?);
        }
        runs.sort_by(f64::total_cmp);
        let median = runs[1];
        out.insert(
            "agent_api_allocs_per_s".into(),
            json!((n as f64 / median).round()),
        );
        out.insert("agent_api_200_ms".into(), json!(round3(median * 1e3)));
    }

    // (d) exec to exec: through the agent, on a file of their own, and host-local.
    if let Some(weir) = weir.filter(|_| part("d")) {
        let file = format!("embedded:{}", dir.path().join("cli.redb").display());
        let none = dir.path().join("no-agent.sock").display().to_string();
        cli_pool(&weir, &file, &none)?;
        let cli_file = cli_processes(&weir, &file, &none, d_ops, 8)?;
        out.insert("cli_file_allocs_per_s".into(), json!(cli_file.round()));
        // Through the agent against host-local, interleaved A B A B: D_ROUNDS rounds of d_ops / D_ROUNDS
        // each; the rates are over all rounds, the ratio is the median of the rounds' ratios.
        let per_round = d_ops / D_ROUNDS;
        let through_agent = agent
            .as_ref()
            .map(|(socket, datastore)| {
                let ds = format!("embedded:{datastore}");
                cli_pool(&weir, &ds, socket).map(|()| (ds, socket.clone()))
            })
            .transpose()?;
        let (mut cli_s, mut hl_s, mut ratios) = (0.0, 0.0, Vec::new());
        for _ in 0..D_ROUNDS {
            let cli = match &through_agent {
                Some((ds, socket)) => Some(cli_processes(&weir, ds, socket, per_round, 8)?),
                None => None,
            };
            let hl = host_local(dir.path(), per_round, 8)?;
            if let Some(cli) = cli {
                cli_s += per_round as f64 / cli;
                ratios.push(cli / hl);
            }
            hl_s += per_round as f64 / hl;
        }
        let ops = (per_round * D_ROUNDS) as f64;
        if through_agent.is_some() {
            out.insert("cli_allocs_per_s".into(), json!((ops / cli_s).round()));
            ratios.sort_by(f64::total_cmp);
            let round = |v: f64| (v * 1000.0).round() / 1000.0;
            out.insert(
                "cli_over_hostlocal".into(),
                json!(round(ratios[ratios.len() / 2])),
            );
            out.insert("cli_over_hostlocal_min".into(), json!(round(ratios[0])));
            out.insert(
                "cli_over_hostlocal_max".into(),
                json!(round(ratios[ratios.len() - 1])),
            );
            out.insert("d_rounds".into(), json!(D_ROUNDS));
        }
        out.insert("hostlocal_allocs_per_s".into(), json!((ops / hl_s).round()));
    }
    out.insert("smoke".into(), Value::Bool(smoke));
    println!("{}", Value::Object(out));
    Ok(())
}
