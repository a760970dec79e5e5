//! Network namespaces: opening `CNI_NETNS` and opening a netlink connection inside it. A netlink
//! socket belongs to the namespace it was created in, so a short-lived thread enters the pod's
//! namespace, creates the socket and leaves; the process itself never changes namespace.

use std::{
    fs::File,
    os::fd::{AsFd as _, AsRawFd as _, RawFd},
    path::{Path, PathBuf},
};

use nix::sched::{CloneFlags, setns};

use crate::{
    error::{CniCode, Code},
    netlink::Netlink,
};

/// Errors opening or entering a namespace.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// The path does not exist (the pod is gone, or the runtime passed a wrong path).
    #[error(
        "the network namespace {path} does not exist: {source}; pass the pod's namespace in CNI_NETNS"
    )]
    Missing {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The path is not a network namespace.
    #[error(
        "{path} is not a network namespace; CNI_NETNS must name one (/run/netns/NAME or /proc/PID/ns/net)"
    )]
    NotNetns {
        /// The path.
        path: PathBuf,
    },
    /// Entering it or opening netlink inside it failed.
    #[error("cannot open netlink inside the network namespace {path}: {source}")]
    Enter {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl CniCode for NetnsError {
    fn code(&self) -> Code {
        match self {
            Self::Missing { .. } | Self::NotNetns { .. } => Code::InvalidEnvironment,
            Self::Enter { .. } => Code::Netns,
        }
    }
}

/// An open network namespace.
#[derive(Debug)]
pub struct Netns {
    file: File,
    path: PathBuf,
}

impl Netns {
    /// Opens `path` and checks that it is a network namespace.
    pub fn open(path: &Path) -> Result<Self, NetnsError> {
        let file = File::open(path).map_err(|source| NetnsError::Missing {
            path: path.to_owned(),
            source,
        })?;
        let is_nsfs = nix::sys::statfs::fstatfs(file.as_fd())
            .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::NSFS_MAGIC);
        if !is_nsfs {
            return Err(NetnsError::NotNetns {
                path: path.to_owned(),
            });
        }
        Ok(Self {
            file,
            path: path.to_owned(),
        })
    }

    /// The raw descriptor (for moving a link into the namespace).
    #[must_use]
    pub fn raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// A netlink connection inside this namespace, driven by the current tokio runtime.
    pub fn netlink(&self) -> Result<Netlink, NetnsError> {
        let runtime = tokio::runtime::Handle::current();
        let enter = |source| NetnsError::Enter {
            path: self.path.clone(),
            source,
        };
        let (connection, handle) = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    setns(self.file.as_fd(), CloneFlags::CLONE_NEWNET)
                        .map_err(std::io::Error::from)?;
                    let _guard = runtime.enter();
                    let (connection, handle, _) = rtnetlink::new_connection()?;
                    Ok((connection, handle))
                })
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("the namespace thread panicked")))
        })
        .map_err(enter)?;
        tokio::spawn(connection);
        Ok(Netlink::new(handle))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_regular_file_is_not_a_netns() {
        let file = tempfile::NamedTempFile::new().expect("temp file");
        let err = Netns::open(file.path()).expect_err("not a netns");
        assert_eq!(err.code(), Code::InvalidEnvironment);
        assert!(err.to_string().contains("not a network namespace"), "{err}");
    }

    #[test]
    fn a_missing_path_is_missing() {
        let err = Netns::open(Path::new("/run/netns/wt-does-not-exist")).expect_err("missing");
        assert!(matches!(err, NetnsError::Missing { .. }), "{err}");
    }

    #[test]
    fn the_own_namespace_opens() {
        Netns::open(Path::new("/proc/self/ns/net")).expect("own netns");
    }
}
