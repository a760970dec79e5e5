//! Socket LB (`--socket-lb-cgroup`, `maps_schema::socket_lb`): the `SOCKET_LB` programs attached to one
//! cgroup v2 directory by bpf links pinned as `links/<program>`, so they stay attached while the agent
//! restarts. Each start attaches the pinned programs anew and pins each new link over the old one, which
//! detaches the old link: for that moment both run, which is harmless (the second sees a backend, no
//! frontend, and leaves the call alone). Without the flag the pins are removed, detaching them. A connect
//! the programs do not see (before the first attach, or from outside the cgroup) is translated per packet
//! by `from_endpoint` as before. The kernel side is [`SocketLbIo`].

use std::{
    io,
    path::{Path, PathBuf},
};

use maps_schema::programs::SOCKET_LB;
use serde::Serialize;

use crate::kernel::{KernelError, SocketLbIo};

/// Which sockets socket LB places (`--socket-lb-scope`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum SocketLbScope {
    /// Every socket of a process in the cgroup.
    All,
    /// Only sockets of the node's own network namespace (the agent's).
    Host,
}

impl std::fmt::Display for SocketLbScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::All => "all",
            Self::Host => "host",
        })
    }
}

/// Errors attaching or detaching socket LB.
#[derive(Debug, thiserror::Error)]
pub enum SocketLbError {
    /// The cgroup directory cannot be examined.
    #[error(
        "cannot open the cgroup {path} (--socket-lb-cgroup): {source}; give an existing cgroup v2 directory, or leave the flag out to turn socket LB off"
    )]
    Cgroup {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The directory is not on a cgroup v2 filesystem.
    #[error(
        "{path} (--socket-lb-cgroup) is not a cgroup v2 directory: give where cgroup2 is mounted (`mount -t cgroup2`; on hybrid hosts often /sys/fs/cgroup/unified) or a directory below it"
    )]
    NotCgroup2 {
        /// The directory.
        path: PathBuf,
    },
    /// This node's network namespace cookie cannot be read.
    #[error(
        "cannot read this node's network namespace cookie (SO_NETNS_COOKIE, kernel 5.14 or later) for --socket-lb-scope host: {0}; use --socket-lb-scope all on this kernel"
    )]
    NetnsCookie(#[source] io::Error),
    /// Which sockets to place cannot be told to the programs.
    #[error(
        "cannot write socket LB's settings (sock_cfg_v1): {0}; restart the agent, or run it without --socket-lb-cgroup"
    )]
    Scope(#[source] KernelError),
    /// A program cannot be attached to the cgroup (or its link pinned).
    #[error(
        "cannot attach the socket LB program {program} to the cgroup {cgroup} (--socket-lb-cgroup): {source}; restart the agent, or run it without --socket-lb-cgroup"
    )]
    Attach {
        /// The program.
        program: &'static str,
        /// The cgroup.
        cgroup: PathBuf,
        /// The cause.
        #[source]
        source: KernelError,
    },
    /// A link pin cannot be removed.
    #[error(
        "cannot detach the socket LB program {program}: {source}; check that the pin root is on bpffs and writable"
    )]
    Detach {
        /// The program.
        program: &'static str,
        /// The cause.
        #[source]
        source: KernelError,
    },
}

/// What [`reconcile`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SocketLbReport {
    /// The cgroup the programs are attached to (None: socket LB off).
    pub cgroup: Option<PathBuf>,
    /// Which sockets in it are placed (None: socket LB off).
    pub scope: Option<SocketLbScope>,
    /// Link pins removed (socket LB turned off).
    pub removed: Vec<String>,
}

/// Attaches the pinned socket LB programs to `cgroup` (replacing the links pinned before), placing the
/// sockets `scope` names, or with `None` detaches them.
pub fn reconcile(
    io: &mut dyn SocketLbIo,
    cgroup: Option<&Path>,
    scope: SocketLbScope,
) -> Result<SocketLbReport, SocketLbError> {
    let Some(cgroup) = cgroup else {
        let mut report = SocketLbReport::default();
        for &program in SOCKET_LB {
            let detached = io
                .detach(program)
                .map_err(|source| SocketLbError::Detach { program, source })?;
            if detached {
                report.removed.push(program.to_owned());
            }
        }
        if !report.removed.is_empty() {
            tracing::info!(links = ?report.removed, "socket LB off: detached");
        }
        return Ok(report);
    };
    match io.is_cgroup2(cgroup) {
        Ok(true) => {}
        Ok(false) => {
            return Err(SocketLbError::NotCgroup2 {
                path: cgroup.to_owned(),
            });
        }
        Err(source) => {
            return Err(SocketLbError::Cgroup {
                path: cgroup.to_owned(),
                source,
            });
        }
    }
    // The scope first: a link attached before it would place every socket for a moment.
    let netns_cookie = match scope {
        SocketLbScope::All => 0,
        SocketLbScope::Host => io.netns_cookie().map_err(SocketLbError::NetnsCookie)?,
    };
    io.write_scope(netns_cookie).map_err(SocketLbError::Scope)?;
    for &program in SOCKET_LB {
        io.attach(cgroup, program)
            .map_err(|source| SocketLbError::Attach {
                program,
                cgroup: cgroup.to_owned(),
                source,
            })?;
    }
    tracing::info!(cgroup = %cgroup.display(), %scope, programs = ?SOCKET_LB, "socket LB attached");
    Ok(SocketLbReport {
        cgroup: Some(cgroup.to_owned()),
        scope: Some(scope),
        removed: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::fake::FakeKernel;

    const CGROUP: &str = "/sys/fs/cgroup/weir.slice";

    fn kernel() -> FakeKernel {
        let kernel = FakeKernel::default();
        kernel.socket_lb().cgroups.insert(CGROUP.into(), true);
        kernel.socket_lb().netns_cookie = Some(4096);
        kernel
    }

    #[test]
    fn every_program_is_attached_to_the_cgroup_after_the_scope() {
        let mut kernel = kernel();
        let report =
            reconcile(&mut kernel, Some(Path::new(CGROUP)), SocketLbScope::Host).expect("attached");
        assert_eq!(report.cgroup.as_deref(), Some(Path::new(CGROUP)));
        assert_eq!(report.scope, Some(SocketLbScope::Host));
        let t = kernel.socket_lb();
        assert_eq!(t.scope, Some(4096), "host scope: this namespace's cookie");
        let attached: Vec<&str> = t.attached.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(attached, SOCKET_LB);
        assert!(t.links.values().all(|c| c == Path::new(CGROUP)));
        assert_eq!(t.links.len(), SOCKET_LB.len());
    }

    #[test]
    fn scope_all_places_every_socket() {
        let mut kernel = kernel();
        kernel.socket_lb().netns_cookie = None;
        reconcile(&mut kernel, Some(Path::new(CGROUP)), SocketLbScope::All).expect("attached");
        assert_eq!(kernel.socket_lb().scope, Some(0));
    }

    #[test]
    fn an_attach_failure_names_the_program_the_cgroup_and_the_fix() {
        let mut kernel = kernel();
        let failing = SOCKET_LB[2];
        kernel.socket_lb().failing.insert(failing.to_owned());
        let e = reconcile(&mut kernel, Some(Path::new(CGROUP)), SocketLbScope::All)
            .expect_err("attach fails");
        let message = e.to_string();
        assert!(message.contains(failing), "{message}");
        assert!(message.contains(CGROUP), "{message}");
        assert!(
            message.contains("run it without --socket-lb-cgroup"),
            "{message}"
        );
        // The programs before the failing one were attached, and the fake recorded them.
        assert_eq!(kernel.socket_lb().attached.len(), 2);
    }

    #[test]
    fn a_directory_that_is_not_cgroup2_or_missing_is_refused_before_any_write() {
        let mut kernel = kernel();
        kernel.socket_lb().cgroups.insert("/tmp".into(), false);
        let e = reconcile(&mut kernel, Some(Path::new("/tmp")), SocketLbScope::All)
            .expect_err("not cgroup2");
        assert!(matches!(e, SocketLbError::NotCgroup2 { .. }), "{e:?}");
        let e = reconcile(&mut kernel, Some(Path::new("/nope")), SocketLbScope::All)
            .expect_err("missing");
        assert!(e.to_string().contains("/nope"), "{e}");
        let t = kernel.socket_lb();
        assert!(
            t.attached.is_empty() && t.scope.is_none(),
            "nothing written"
        );
    }

    #[test]
    fn host_scope_without_a_cookie_says_to_use_scope_all() {
        let mut kernel = kernel();
        kernel.socket_lb().netns_cookie = None;
        let e = reconcile(&mut kernel, Some(Path::new(CGROUP)), SocketLbScope::Host)
            .expect_err("no cookie");
        assert!(e.to_string().contains("--socket-lb-scope all"), "{e}");
        assert!(kernel.socket_lb().attached.is_empty());
    }

    #[test]
    fn without_a_cgroup_the_links_are_detached() {
        let mut kernel = kernel();
        reconcile(&mut kernel, Some(Path::new(CGROUP)), SocketLbScope::All).expect("attached");
        assert_eq!(
            kernel.socket_lb().links.len(),
            SOCKET_LB.len(),
            "precondition"
        );
        let report = reconcile(&mut kernel, None, SocketLbScope::All).expect("detached");
        assert_eq!(report.removed, SOCKET_LB);
        assert_eq!(report.cgroup, None);
        assert!(kernel.socket_lb().links.is_empty());
        let again = reconcile(&mut kernel, None, SocketLbScope::All).expect("nothing to do");
        assert!(again.removed.is_empty());
    }
}
