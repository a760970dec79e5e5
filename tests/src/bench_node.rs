//! The agent's dataplane loop in process over its real kernel maps, for the benchmarks that drive it
//! (`policy-bench`; `datapath-bench`'s drift refresh): the maps are created and pinned by the agent's own
//! loader under the caller's pin root; there are no veths (every workload link is taken as already running
//! the programs: [`LinksInPlace`]), so what runs is sources → calculation → map drivers → kernel maps.

use std::{
    collections::BTreeMap,
    thread::JoinHandle,
    time::{Duration, Instant},
};

use agent::{
    control::{
        applier::{self, Command, LoopHandle},
        node::Node,
        snapshot::Snapshot,
    },
    dataplane::{
        attachments::{AttachDriver, Attacher, Hook},
        endpoints::EndpointsManager,
        map_driver::MapDriver,
        plane::Dataplane,
    },
    kernel::{KernelError, LinkEvent, PinnedHash, PinnedLpm, real::programs::Programs},
    paths::Paths,
    synthetic::{self, Sizes},
};
use anyhow::{Context as _, Result};
use aya::programs::TcAttachType;

/// Every workload link already runs the programs (the benchmarks have no veths).
pub struct LinksInPlace;

impl Attacher for LinksInPlace {
    fn pinned(&self) -> Result<Vec<(String, String)>, KernelError> {
        Ok(Vec::new())
    }
    fn has_pin(&self, _: &str, _: &str) -> bool {
        false
    }
    fn hook(&mut self, _: &str, _: u32, _: &str, _: TcAttachType) -> Result<Hook, KernelError> {
        Ok(Hook {
            ours: Some(1),
            leftovers: false,
        })
    }
    fn current(&self, _: &str) -> u32 {
        1
    }
    fn link_exists(&self, _: &str, _: u32) -> bool {
        true
    }
    fn attach(&mut self, _: &str, _: u32, _: &str, _: TcAttachType) -> Result<(), KernelError> {
        Ok(())
    }
    fn update(&mut self, _: &str, _: u32, _: &str, _: TcAttachType) -> Result<(), KernelError> {
        Ok(())
    }
    fn sweep(&mut self, _: &str, _: u32, _: &str, _: TcAttachType) -> Result<u64, KernelError> {
        Ok(0)
    }
    fn unpin(&mut self, _: &str, _: &str) -> Result<(), KernelError> {
        Ok(())
    }
}

/// The agent's maps, created and pinned by its loader under `paths.bpf_root`.
pub fn dataplane(paths: &Paths) -> Result<Dataplane> {
    use maps_schema::maps::{ENDPOINTS, IDENT4, IDENT6, IPCACHE4, IPCACHE6, POLICY};
    drop(Programs::load(paths, agent::EBPF_OBJECT, &[])?);
    let pin = |n: &str| paths.map_pin(n);
    Ok(Dataplane {
        attachments: AttachDriver::new(Box::new(LinksInPlace)),
        endpoints: MapDriver::new(Box::new(PinnedHash::open(ENDPOINTS, &pin(ENDPOINTS))?)),
        endpoints_manager: EndpointsManager::new(),
        ident4: MapDriver::new(Box::new(PinnedHash::open(IDENT4, &pin(IDENT4))?)),
        ident6: MapDriver::new(Box::new(PinnedHash::open(IDENT6, &pin(IDENT6))?)),
        ipcache4: MapDriver::new(Box::new(PinnedLpm::open(IPCACHE4, &pin(IPCACHE4))?)),
        ipcache6: MapDriver::new(Box::new(PinnedLpm::open(IPCACHE6, &pin(IPCACHE6))?)),
        policy: MapDriver::new(Box::new(PinnedHash::open(POLICY, &pin(POLICY))?)),
        services: agent::dataplane::services::ServiceMaps::open(paths)?,
    })
}

/// The workload links of the synthetic node's endpoints (made-up indexes: there are no veths).
#[must_use]
pub fn links(sizes: Sizes) -> BTreeMap<String, u32> {
    (0..sizes.endpoints)
        .map(|i| {
            (
                synthetic::host_ifname(i),
                1_000_000 + u32::try_from(i).unwrap_or(0),
            )
        })
        .collect()
}

/// Opens the node over fresh maps (its registry and policy directory as `paths` name them) and starts
/// the loop, with its periodic refresh (`--refresh-interval`) every `refresh`; returns the program
/// load time (s) too.
pub fn open(paths: &Paths, refresh: Option<Duration>) -> Result<(LoopHandle, JoinHandle<()>, f64)> {
    let t = Instant::now();
    let dataplane = dataplane(paths)?;
    let load = t.elapsed().as_secs_f64();
    let (set, errors) = agent::calc::policy::load::load_dir(&paths.policy_dir);
    anyhow::ensure!(errors.is_empty(), "bench policy refused: {errors:?}");
    let mut node = Node::open(paths, dataplane, set, Vec::new())?;
    node.set_refresh_interval(refresh);
    let (handle, thread) = applier::spawn(node)?;
    Ok((handle, thread, load))
}

/// Sends every link and `Synced`, as the link watcher's first dump does.
pub fn feed_links(handle: &LoopHandle, links: &BTreeMap<String, u32>) -> Result<()> {
    for (ifname, ifindex) in links {
        handle.send(Command::Link(LinkEvent::Up {
            ifname: ifname.clone(),
            ifindex: *ifindex,
            up: true,
        }))?;
    }
    handle.send(Command::Link(LinkEvent::Synced))?;
    Ok(())
}

/// Waits (at most 300 s) until the loop's snapshot satisfies `ok`.
pub async fn wait(handle: &LoopHandle, what: &str, ok: impl Fn(&Snapshot) -> bool) -> Result<()> {
    let mut rx = handle.subscribe();
    tokio::time::timeout(Duration::from_secs(300), rx.wait_for(|s| ok(s)))
        .await
        .with_context(|| {
            format!(
                "{what}: not within 300 s; the loop reports {:?}",
                handle.snapshot().applied
            )
        })?
        .with_context(|| format!("{what}: the loop stopped"))?;
    Ok(())
}

/// This process's CPU time (user and system, every thread), in ms.
#[must_use]
pub fn cpu_ms() -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given; RUSAGE_SELF is always valid.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    let ms = |t: libc::timeval| t.tv_sec as f64 * 1e3 + t.tv_usec as f64 / 1e3;
    ms(usage.ru_utime) + ms(usage.ru_stime)
}
