//! Loads the embedded eBPF object: maps pinned by their versioned names under `<root>/maps`,
//! programs loaded and pinned under `<root>/progs` so `weir-cni` and a restarted agent can reuse them.

use std::{io, path::PathBuf};

use aya::{
    Ebpf, EbpfError, EbpfLoader, VerifierLogLevel,
    programs::{Program, ProgramError},
};
use serde::Serialize;

use crate::{
    kernel::{InspectIo, KernelError, real::bpffs},
    paths::Paths,
};

/// Errors loading the programs.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// bpffs or the pin root is not usable.
    #[error(transparent)]
    Bpffs(#[from] bpffs::BpffsError),
    /// The object could not be parsed or its maps created/reused.
    #[error(
        "cannot load the eBPF object: {source}; an incompatible pinned map needs `weir bpf migrate` (or remove the pin root if no traffic depends on it)"
    )]
    Object {
        /// The cause.
        #[source]
        source: Box<EbpfError>,
    },
    /// The verifier (or the kernel) rejected a program.
    #[error("the kernel rejected program {program}: {source}\n{verifier_log}")]
    Program {
        /// The program.
        program: String,
        /// The verifier log, when there is one.
        verifier_log: String,
        /// The cause.
        #[source]
        source: Box<ProgramError>,
    },
    /// The object does not contain an expected program.
    #[error("the eBPF object has no program {program}: rebuild it with `cargo xtask build-ebpf`")]
    MissingProgram {
        /// The program.
        program: String,
    },
    /// A program could not be pinned.
    #[error("cannot pin program {program} at {path}: {source}")]
    Pin {
        /// The program.
        program: String,
        /// The pin.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// A loaded object with its programs loaded (and pinned when loaded through [`load_pinned`]).
pub struct Loaded {
    /// The aya object.
    pub ebpf: Ebpf,
}

/// What was loaded, for the operator.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct LoadReport {
    /// Programs: name, kernel id, pin.
    pub programs: Vec<ProgramReport>,
    /// Maps: name, kernel id, pin, max entries.
    pub maps: Vec<MapReport>,
    /// Pins that should be there but could not be read (each also logged): the pin root was
    /// changed under the agent; restart it to load and pin again.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<UnreadablePin>,
}

/// A pin the report could not read.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct UnreadablePin {
    /// Pin path.
    pub pin: PathBuf,
    /// Why (the kernel's answer).
    pub error: String,
}

/// One loaded program.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ProgramReport {
    /// Kernel name.
    pub name: String,
    /// Kernel program id.
    pub id: u32,
    /// Pin path.
    pub pin: PathBuf,
}

/// One pinned map.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct MapReport {
    /// Versioned name.
    pub name: String,
    /// Kernel map id.
    pub id: u32,
    /// Pin path.
    pub pin: PathBuf,
    /// Size.
    pub max_entries: u32,
}

/// Loads every program of an object (given as bytes) without pinning anything: maps are pinned
/// under `pin_dir`. Used by the agent and by the verifier gate.
pub fn load_object(object: &[u8], maps_dir: &std::path::Path) -> Result<Ebpf, LoadError> {
    load_object_sized(object, maps_dir, &[])
}

/// As [`load_object`], with `(map name, max_entries)` overrides (the conntrack size flag).
pub fn load_object_sized(
    object: &[u8],
    maps_dir: &std::path::Path,
    sizes: &[(String, u32)],
) -> Result<Ebpf, LoadError> {
    bpffs::ensure_pin_dir(maps_dir)?;
    let mut loader = EbpfLoader::new();
    for (name, size) in sizes {
        loader.map_max_entries(name, *size);
    }
    let mut ebpf = loader
        .default_map_pin_directory(maps_dir)
        .verifier_log_level(VerifierLogLevel::default())
        .load(object)
        .map_err(|source| LoadError::Object {
            source: Box::new(source),
        })?;
    for (name, program) in ebpf.programs_mut() {
        load_program(name, program)?;
    }
    Ok(ebpf)
}

fn load_program(name: &str, program: &mut Program) -> Result<(), LoadError> {
    let result = match program {
        Program::SchedClassifier(p) => p.load(),
        Program::Xdp(p) => p.load(),
        Program::CgroupSockAddr(p) => p.load(),
        _ => {
            return Err(LoadError::Program {
                program: name.to_owned(),
                verifier_log: String::new(),
                source: Box::new(ProgramError::UnexpectedProgramType),
            });
        }
    };
    result.map_err(|source| {
        let verifier_log = match &source {
            ProgramError::LoadError { verifier_log, .. } => verifier_log.to_string(),
            _ => String::new(),
        };
        LoadError::Program {
            program: name.to_owned(),
            verifier_log,
            source: Box::new(source),
        }
    })
}

/// Loads the agent's object under `paths`: bpffs mounted, pin directories created, maps pinned (or
/// reused) under `maps/`, every program loaded but not yet pinned (see `programs`). `sizes`
/// overrides map sizes by name.
pub fn load_for_agent(
    paths: &Paths,
    object: &[u8],
    sizes: &[(String, u32)],
) -> Result<Loaded, LoadError> {
    bpffs::ensure_mounted(std::path::Path::new(crate::paths::BPFFS_MOUNT))?;
    bpffs::ensure_pin_dir(&paths.bpf_root)?;
    bpffs::ensure_pin_dir(&paths.progs_dir())?;
    bpffs::ensure_pin_dir(&paths.links_dir())?;
    let ebpf = load_object_sized(object, &paths.maps_dir(), sizes)?;
    for name in maps_schema::programs::ALL {
        if ebpf.program(name).is_none() {
            return Err(LoadError::MissingProgram {
                program: (*name).to_owned(),
            });
        }
    }
    Ok(Loaded { ebpf })
}

/// Pins `program` at `path`, replacing an older pin with a rename so the path never disappears.
fn pin_replacing(
    program: &mut Program,
    name: &str,
    path: &std::path::Path,
) -> Result<(), LoadError> {
    bpffs::pin_by_rename(path, |staging| {
        program.pin(staging).map_err(io::Error::other)
    })
    .map_err(|source| LoadError::Pin {
        program: name.to_owned(),
        path: path.to_owned(),
        source,
    })
}

impl Loaded {
    /// The kernel tag (hash of the instructions) of a loaded program.
    #[must_use]
    pub fn program_tag(&self, name: &str) -> Option<u64> {
        let info = match self.ebpf.program(name)? {
            Program::SchedClassifier(p) => p.info(),
            Program::Xdp(p) => p.info(),
            Program::CgroupSockAddr(p) => p.info(),
            _ => return None,
        };
        info.ok().map(|i| i.tag())
    }

    /// Pins a loaded program at `path`, replacing an older pin atomically.
    pub fn pin_program(&mut self, name: &str, path: &std::path::Path) -> Result<(), LoadError> {
        let program = self
            .ebpf
            .program_mut(name)
            .ok_or_else(|| LoadError::MissingProgram {
                program: name.to_owned(),
            })?;
        pin_replacing(program, name, path)
    }
}

/// The object's map names with conntrack at layout `ct_layout`.
#[must_use]
pub fn map_names(ct_layout: u32) -> Vec<String> {
    let (ct4, ct6) = crate::kernel::ct_layout::map_names(ct_layout);
    maps_schema::maps::ALL
        .iter()
        .map(|name| match *name {
            maps_schema::maps::CT4 => ct4.clone(),
            maps_schema::maps::CT6 => ct6.clone(),
            other => other.to_owned(),
        })
        .collect()
}

/// Of the map pin names `present`, those `stale_pins` removes (none if the object does not parse).
#[must_use]
pub fn stale_map_pins(object: &[u8], present: &[String]) -> Vec<String> {
    let Ok(obj) = aya_obj::Object::parse(object) else {
        return Vec::new();
    };
    let stem = |name: &str| {
        maps_schema::maps::layout_version(name)
            .and_then(|v| name.strip_suffix(&format!("_v{v}")).map(str::to_owned))
    };
    let ours: std::collections::BTreeSet<&String> = obj.maps.keys().collect();
    let stems: std::collections::BTreeSet<String> = obj
        .maps
        .keys()
        .filter_map(|n| stem(n))
        .filter(|s| s != maps_schema::maps::CT4_STEM && s != maps_schema::maps::CT6_STEM)
        .collect();
    present
        .iter()
        .filter(|name| !ours.contains(name) && stem(name).is_some_and(|s| stems.contains(&s)))
        .cloned()
        .collect()
}

/// What is pinned under `paths` (read through `kernel`, as an operator would see it), conntrack
/// at layout `ct_layout`. A pin that cannot be read is logged and listed in `unreadable`.
#[must_use]
pub fn report(kernel: &dyn InspectIo, paths: &Paths, ct_layout: u32) -> LoadReport {
    let mut unreadable = Vec::new();
    let mut failed = |pin: PathBuf, error: &KernelError| {
        tracing::warn!(pin = %pin.display(), error = %error, "cannot read a pin for the start report");
        unreadable.push(UnreadablePin {
            pin,
            error: error.to_string(),
        });
    };
    let mut programs = Vec::new();
    for name in maps_schema::programs::ALL {
        let pin = paths.prog_pin(name);
        match kernel.program_id(name) {
            Ok(id) => programs.push(ProgramReport {
                name: (*name).to_owned(),
                id,
                pin,
            }),
            Err(e) => failed(pin, &e),
        }
    }
    let mut maps = Vec::new();
    for name in map_names(ct_layout) {
        let pin = paths.map_pin(&name);
        match kernel.map_meta(&name) {
            Ok(meta) => maps.push(MapReport {
                name,
                id: meta.id,
                max_entries: meta.max_entries,
                pin,
            }),
            Err(e) => failed(pin, &e),
        }
    }
    LoadReport {
        programs,
        maps,
        unreadable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::{MapMeta, fake::FakeKernel};

    #[test]
    fn the_start_report_lists_what_is_pinned_and_names_a_pin_it_cannot_read() {
        let kernel = FakeKernel::default();
        let paths = Paths::with_bpf_root("/sys/fs/bpf/wt-report");
        let layout = maps_schema::conntrack::LAYOUT;
        let names = map_names(layout);
        for (i, name) in maps_schema::programs::ALL.iter().enumerate() {
            kernel
                .program_ids()
                .insert((*name).to_owned(), 10 + u32::try_from(i).expect("i"));
        }
        for (i, name) in names.iter().enumerate().skip(1) {
            let n = u32::try_from(i).expect("i");
            kernel.map_metas().insert(
                name.clone(),
                MapMeta {
                    id: 100 + n,
                    max_entries: 1000 + n,
                    ..MapMeta::default()
                },
            );
        }
        let report = report(&kernel, &paths, layout);
        assert_eq!(report.programs.len(), maps_schema::programs::ALL.len());
        assert_eq!(report.programs[0].id, 10);
        assert_eq!(
            report.programs[0].pin,
            paths.prog_pin(maps_schema::programs::ALL[0])
        );
        assert_eq!(
            report
                .maps
                .iter()
                .map(|m| m.name.clone())
                .collect::<Vec<_>>(),
            names[1..].to_vec()
        );
        assert_eq!((report.maps[0].id, report.maps[0].max_entries), (101, 1001));
        assert_eq!(
            report
                .unreadable
                .iter()
                .map(|u| u.pin.clone())
                .collect::<Vec<_>>(),
            vec![paths.map_pin(&names[0])],
            "the one pin that cannot be read is named, not left out silently"
        );
    }
}
