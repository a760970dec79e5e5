//! The real [`Attacher`]: tcx links pinned under `links/`, programs from `programs::Programs`.

use std::{fs, io};

use aya::programs::{
    SchedClassifier, TcAttachType,
    links::{FdLink, PinnedLink},
};

use super::{attachments::Attacher, kernel::KernelError};
use crate::{attach, paths::Paths, programs::Programs};

/// Attaches the agent's tc programs to workload links.
pub struct TcLinks {
    paths: Paths,
    from_endpoint: SchedClassifier,
    to_endpoint: SchedClassifier,
}

fn kerr(
    op: &'static str,
    what: String,
    e: impl std::error::Error + Send + Sync + 'static,
) -> KernelError {
    KernelError::Attach {
        op,
        what,
        source: Box::new(e),
    }
}

impl TcLinks {
    /// Uses the agent's tc programs.
    pub fn new(paths: Paths, programs: Programs) -> Self {
        Self {
            paths,
            from_endpoint: programs.from_endpoint,
            to_endpoint: programs.to_endpoint,
        }
    }

    fn program(&mut self, name: &str) -> &mut SchedClassifier {
        if name == maps_schema::programs::FROM_ENDPOINT {
            &mut self.from_endpoint
        } else {
            &mut self.to_endpoint
        }
    }
}

impl Attacher for TcLinks {
    fn pinned(&self) -> Result<Vec<(String, String)>, KernelError> {
        let dir = self.paths.links_dir();
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(kerr("list", dir.display().to_string(), e)),
        };
        Ok(entries
            .filter_map(Result::ok)
            .filter_map(|e| crate::paths::parse_link_pin(&e.file_name().to_string_lossy()))
            .collect())
    }

    fn pinned_program(&self, ifname: &str, program: &str) -> Option<u32> {
        let pin = self.paths.link_pin(ifname, program);
        let link = FdLink::from(PinnedLink::from_pin(&pin).ok()?);
        link.info().ok().map(|info| info.program_id())
    }

    fn is_attached(&self, ifindex: u32, hook: TcAttachType, id: u32) -> bool {
        SchedClassifier::query_tcx(ifindex, hook)
            .is_ok_and(|(_, progs)| progs.iter().any(|p| p.id() == id))
    }

    fn link_exists(&self, ifname: &str, ifindex: u32) -> bool {
        nix::net::if_::if_nametoindex(ifname).is_ok_and(|i| i == ifindex)
    }

    fn current(&self, program: &str) -> u32 {
        let handle = if program == maps_schema::programs::FROM_ENDPOINT {
            &self.from_endpoint
        } else {
            &self.to_endpoint
        };
        Programs::id_of(handle)
    }

    fn attach(
        &mut self,
        ifname: &str,
        program: &str,
        hook: TcAttachType,
    ) -> Result<(), KernelError> {
        let pin = self.paths.link_pin(ifname, program);
        let prog = self.program(program);
        attach::attach_tc(prog, program, ifname, hook, &pin)
            .map_err(|e| kerr("attach", format!("{program} to {ifname}"), e))?;
        Ok(())
    }

    fn update(
        &mut self,
        ifname: &str,
        program: &str,
        hook: TcAttachType,
    ) -> Result<(), KernelError> {
        // attach_tc reuses an existing pin through bpf_link_update.
        self.attach(ifname, program, hook)
    }

    fn unpin(&mut self, ifname: &str, program: &str) -> Result<(), KernelError> {
        let pin = self.paths.link_pin(ifname, program);
        match fs::remove_file(&pin) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                Err(kerr("unpin", pin.display().to_string(), e))
            }
            _ => Ok(()),
        }
    }
}
