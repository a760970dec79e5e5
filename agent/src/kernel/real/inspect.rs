//! The real [`InspectIo`] and [`TraceIo`]: the pin root's maps and programs, opened per request
//! (a migration or a reload replaces pins; the next request sees the new ones).

use std::io::Read as _;

use aya::{
    maps::{Array, Map, MapData, MapInfo, RingBuf},
    programs::{SchedClassifier, TestRun as _, TestRunOptions},
};
use futures_util::StreamExt as _;
use maps_schema::TraceConfig;
use tokio::io::unix::AsyncFd;

use crate::kernel::{
    CountersIo, CtIo, InspectIo, KernelError, MapMeta, RecordStream, TraceIo, TraceIoError,
    real::{counters::PinnedCounters, ct::PinnedCt},
};
use crate::paths::Paths;

/// The pin root's maps as the API reads them.
pub struct PinnedInspect {
    paths: Paths,
}

impl PinnedInspect {
    /// Over the pins under `paths`.
    #[must_use]
    pub fn new(paths: &Paths) -> Self {
        Self {
            paths: paths.clone(),
        }
    }
}

fn open_err(name: &str, pin: &std::path::Path) -> impl Fn(aya::maps::MapError) -> KernelError {
    let path = format!("{name} at {}", pin.display());
    move |source| KernelError::OpenMap {
        path: path.clone(),
        source: Box::new(source),
    }
}

impl InspectIo for PinnedInspect {
    fn map_meta(&self, name: &str) -> Result<MapMeta, KernelError> {
        let pin = self.paths.map_pin(name);
        let info = MapInfo::from_pin(&pin).map_err(open_err(name, &pin))?;
        Ok(MapMeta {
            id: info.id(),
            // A type newer than aya knows is shown as 0 (`BPF_MAP_TYPE_UNSPEC`); the id names it.
            map_type: info.map_type().map_or(0, |t| t as u32),
            key_size: info.key_size(),
            value_size: info.value_size(),
            max_entries: info.max_entries(),
            flags: info.map_flags(),
        })
    }

    fn program_id(&self, name: &str) -> Result<u32, KernelError> {
        let pin = self.paths.prog_pin(name);
        aya::programs::ProgramInfo::from_pin(&pin)
            .map(|info| info.id())
            .map_err(|source| KernelError::OpenProgram {
                path: pin.display().to_string(),
                source: Box::new(source),
            })
    }

    fn counter_array(&self, name: &str) -> Result<Box<dyn CountersIo>, KernelError> {
        Ok(Box::new(PinnedCounters::open(&self.paths, name)?))
    }

    fn conntrack(&self, layout: u32) -> Box<dyn CtIo> {
        Box::new(PinnedCt::new(&self.paths, layout))
    }

    fn nat(
        &self,
    ) -> Result<
        Box<dyn crate::kernel::MapIo<maps_schema::Nat4Key, maps_schema::Nat4Entry>>,
        KernelError,
    > {
        let name = maps_schema::maps::NAT4;
        Ok(Box::new(crate::kernel::PinnedHash::open(
            name,
            &self.paths.map_pin(name),
        )?))
    }

    fn nat_events(&self) -> Result<Option<[u64; crate::kernel::NAT_EVENTS]>, KernelError> {
        use maps_schema::nat::{
            EVENT_COLLISION, EVENT_CREATED, EVENT_EXHAUSTED, EVENT_INSERT_FAILED,
        };
        let slots = [
            EVENT_CREATED,
            EVENT_COLLISION,
            EVENT_EXHAUSTED,
            EVENT_INSERT_FAILED,
        ];
        let sums = crate::kernel::real::ct::read_event_sums(
            &self.paths,
            maps_schema::maps::NAT_EVENTS,
            &slots,
        )?;
        Ok(sums.map(|s| [s[0], s[1], s[2], s[3]]))
    }

    fn drop_events(&self) -> Result<RecordStream, KernelError> {
        let name = maps_schema::maps::DROP_EVENTS;
        let pin = self.paths.map_pin(name);
        let err = open_err(name, &pin);
        let data = MapData::from_pin(&pin).map_err(&err)?;
        let ring = RingBuf::try_from(Map::RingBuf(data)).map_err(&err)?;
        // SAFETY: the ring owns its map's fd: it stays open, and is the one `as_raw_fd` returns,
        // for as long as the `AsyncFd` owns the ring.
        let ring = unsafe { AsyncFd::register(ring) }.map_err(|e| KernelError::Io {
            op: "poll",
            what: format!("the ring buffer {}", pin.display()),
            source: e.into(),
        })?;
        let what = format!("the ring buffer {}", pin.display());
        Ok(futures_util::stream::unfold(Some(ring), move |ring| {
            let what = what.clone();
            async move {
                let mut ring = ring?;
                match read_batch(&mut ring).await {
                    Ok(batch) => Some((Ok(batch), Some(ring))),
                    // The error is the stream's last item.
                    Err(source) => Some((
                        Err(KernelError::Io {
                            op: "wait on",
                            what,
                            source,
                        }),
                        None,
                    )),
                }
            }
        })
        .flat_map(|batch| {
            futures_util::stream::iter(match batch {
                Ok(records) => records.into_iter().map(Ok).collect::<Vec<_>>(),
                Err(e) => vec![Err(e)],
            })
        })
        .boxed())
    }
}

/// Waits until the ring is readable, then takes every record in it.
async fn read_batch(ring: &mut AsyncFd<RingBuf<MapData>>) -> std::io::Result<Vec<Vec<u8>>> {
    loop {
        let mut guard = ring.readable_mut().await?;
        let mut out = Vec::new();
        while let Some(item) = guard.get_inner_mut().next() {
            out.push(item.to_vec());
        }
        guard.clear_ready();
        if !out.is_empty() {
            return Ok(out);
        }
    }
}

impl TraceIo for PinnedInspect {
    fn trace_nonce(&self) -> Result<u64, TraceIoError> {
        let pin = self.paths.map_pin(maps_schema::maps::TRACE);
        let err = |op: &'static str| {
            let path = pin.display().to_string();
            move |source| TraceIoError::TraceMap {
                op,
                path,
                source: Box::new(source),
            }
        };
        let data = MapData::from_pin(&pin).map_err(err("open"))?;
        let mut array: Array<MapData, TraceConfig> =
            Array::try_from(Map::Array(data)).map_err(err("open"))?;
        let current = array.get(&0, 0).map_err(err("read"))?;
        if current.nonce != 0 {
            return Ok(current.nonce);
        }
        let mut bytes = [0u8; 8];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut bytes))
            .map_err(TraceIoError::Random)?;
        let nonce = u64::from_ne_bytes(bytes) | 1;
        array
            .set(0, &TraceConfig { nonce }, 0)
            .map_err(err("write"))?;
        Ok(nonce)
    }

    fn ifindex(&self, ifname: &str) -> Result<u32, TraceIoError> {
        nix::net::if_::if_nametoindex(ifname).map_err(|source| TraceIoError::Ifindex {
            ifname: ifname.to_owned(),
            source,
        })
    }

    fn test_run(
        &self,
        program: &'static str,
        frame: &[u8],
        ctx: &[u8],
    ) -> Result<Vec<u8>, TraceIoError> {
        let pin = self.paths.prog_pin(program);
        let prog = SchedClassifier::from_pin(&pin).map_err(|source| TraceIoError::OpenProgram {
            path: pin.display().to_string(),
            source: Box::new(source),
        })?;
        let mut out = vec![0u8; ctx.len()];
        let opts = TestRunOptions {
            data_in: Some(frame),
            ctx_in: Some(ctx),
            ctx_out: Some(&mut out),
            ..TestRunOptions::default()
        };
        prog.test_run(opts)
            .map_err(|source| TraceIoError::TestRun {
                program,
                source: Box::new(source),
            })?;
        Ok(out)
    }
}
