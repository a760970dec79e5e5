//! The drift refresh's cost (issue 39): the agent's dataplane loop in process (`tests::bench_node`) over its
//! real maps, pinned under a `wt*` pin root of its own, converged on the synthetic node (10,000 endpoints, at
//! least 100,000 `policy_v1` entries; smoke: a small node), then refreshed every second as
//! `--refresh-interval` does: each map driver checks its pin, reads its whole map back and classifies every
//! entry against what it had in sync, and the attachment driver walks every workload link (taken as in
//! place: there are no veths). Nothing changed the maps, so nothing may be repaired.
//!
//! `refresh_full_ms` is this process's CPU time per refresh (every thread; the loop is otherwise idle, and
//! what little else runs in the window counts too: an upper bound); `refresh_cpu_pct` is that over the
//! agent's default interval (10 s) as a share of one core. A positive control then deletes one `policy_v1`
//! entry from outside and waits for a refresh to put it back (`refresh_control_repairs`).

use std::{collections::BTreeMap, time::Duration};

use agent::{control::applier::LoopHandle, synthetic};
use anyhow::{Context as _, Result};
use aya::maps::{HashMap, Map, MapData};
use maps_schema::{EndpointInfo, PolicyKey, PolicyValue, maps};
use serde_json::{Value, json};
use tests::{
    agent_proc::AgentDirs,
    bench_node::{cpu_ms, feed_links, links, open, wait},
    bpf::PinRoot,
};

use crate::Sizes;

/// How often the loop refreshes here: short, so that [`REFRESHES`] refreshes take seconds.
const BENCH_REFRESH: Duration = Duration::from_secs(1);
/// The agent's default `--refresh-interval` (seconds), which `refresh_cpu_pct` is taken against.
const DEFAULT_REFRESH_S: f64 = 10.0;
/// Refreshes timed.
const REFRESHES: u64 = 5;
/// The least number of `policy_v1` entries a full run refreshes (issue 39: 100,000 policy entries).
const FULL_POLICY_ENTRIES: usize = 100_000;

fn refreshes(handle: &LoopHandle) -> u64 {
    handle.snapshot().measured.refreshes
}

fn repairs(handle: &LoopHandle) -> u64 {
    handle.snapshot().stats.repairs.iter().map(|(_, n)| n).sum()
}

/// The entries of the pinned hash map `name`, counted through the bpf syscall (outside the timed window).
fn entries<K: aya::Pod, V: aya::Pod>(root: &PinRoot, name: &str) -> Result<usize> {
    let pin = root.paths().map_pin(name);
    let data = MapData::from_pin(&pin).with_context(|| format!("cannot open {}", pin.display()))?;
    let map: HashMap<_, K, V> =
        HashMap::try_from(Map::HashMap(data)).with_context(|| format!("{name} is not a hash"))?;
    Ok(map.keys().filter_map(Result::ok).count())
}

/// Deletes one `policy_v1` entry through the pin, as `bpftool map delete` would.
fn delete_one_policy_entry(root: &PinRoot) -> Result<()> {
    let pin = root.paths().map_pin(maps::POLICY);
    let data = MapData::from_pin(&pin).with_context(|| format!("cannot open {}", pin.display()))?;
    let mut map: HashMap<_, PolicyKey, PolicyValue> =
        HashMap::try_from(Map::HashMap(data)).context("policy_v1 is not a hash")?;
    let key = map
        .keys()
        .next()
        .context("policy_v1 is empty")?
        .context("cannot read a policy_v1 key")?;
    map.remove(&key)
        .context("cannot delete a policy_v1 entry")?;
    Ok(())
}

async fn measure(
    sizes: synthetic::Sizes,
    full: bool,
    figures: &mut BTreeMap<String, Value>,
) -> Result<()> {
    let root = PinRoot::new();
    let dirs = AgentDirs::new();
    let mut paths = root.paths();
    paths.state_dir = dirs.path("state");
    paths.policy_dir = dirs.path("policies");
    synthetic::write(&paths, sizes)?;
    let (handle, thread, _) = open(&paths, Some(BENCH_REFRESH))?;
    let result = async {
        feed_links(&handle, &links(sizes))?;
        wait(&handle, "converge", |s| s.applied.ready).await?;
        let policy_entries = entries::<PolicyKey, PolicyValue>(&root, maps::POLICY)?;
        let endpoints = entries::<u32, EndpointInfo>(&root, maps::ENDPOINTS)?;
        anyhow::ensure!(
            endpoints == sizes.endpoints,
            "endpoints_v1 holds {endpoints} entries, {} expected",
            sizes.endpoints
        );
        anyhow::ensure!(
            !full || policy_entries >= FULL_POLICY_ENTRIES,
            "policy_v1 holds {policy_entries} entries, fewer than the {FULL_POLICY_ENTRIES} the refresh must be \
             measured over: raise the synthetic node's policies"
        );
        let entries_total: u64 = handle.snapshot().stats.maps.iter().map(|(_, s)| s.writes).sum();

        let first = refreshes(&handle) + 1;
        wait(&handle, "a first refresh", |s| s.measured.refreshes >= first).await?;
        let cpu = cpu_ms();
        wait(&handle, "the timed refreshes", |s| {
            s.measured.refreshes >= first + REFRESHES
        })
        .await?;
        let per_refresh = (cpu_ms() - cpu) / REFRESHES as f64;
        let repaired = repairs(&handle);
        anyhow::ensure!(
            repaired == 0,
            "the refresh repaired {repaired} entries nothing had changed"
        );

        // The positive control: a refresh reads the map back and puts a deleted entry back.
        delete_one_policy_entry(&root)?;
        let after = refreshes(&handle) + 2;
        wait(&handle, "the control's repair", |s| {
            s.measured.refreshes >= after && s.stats.repairs.iter().any(|(_, n)| *n > 0)
        })
        .await?;
        let control = repairs(&handle);
        anyhow::ensure!(
            entries::<PolicyKey, PolicyValue>(&root, maps::POLICY)? == policy_entries,
            "the control's deleted policy_v1 entry is not back"
        );

        figures.insert("refresh_endpoints".into(), json!(endpoints));
        figures.insert("refresh_policy_entries".into(), json!(policy_entries));
        figures.insert("refresh_entries".into(), json!(entries_total));
        figures.insert("refresh_full_ms".into(), json!(per_refresh));
        figures.insert(
            "refresh_cpu_pct".into(),
            json!(per_refresh / (DEFAULT_REFRESH_S * 1e3) * 100.0),
        );
        figures.insert("refresh_control_repairs".into(), json!(control));
        Ok(())
    }
    .await;
    handle.stop();
    let _joined = thread.join();
    result
}

/// Measures the refresh at `sizes.refresh` and adds its figures.
pub fn run(sizes: Sizes, full: bool, figures: &mut BTreeMap<String, Value>) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(measure(sizes.refresh, full, figures))
}
