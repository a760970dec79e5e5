//! Makes sure bpffs is mounted and the pin root exists with mode 0700.

use std::{
    fs, io,
    os::unix::fs::{DirBuilderExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
};

use nix::{
    mount::{MsFlags, mount},
    sys::statfs::{BPF_FS_MAGIC, statfs},
};

/// Errors preparing bpffs.
#[derive(Debug, thiserror::Error)]
pub enum BpffsError {
    /// statfs failed.
    #[error("cannot inspect {path}: {source}")]
    Stat {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: nix::Error,
    },
    /// mount failed.
    #[error(
        "bpffs is not mounted at {path} and mounting it failed ({source}); run as root or mount it: mount -t bpf bpf {path}"
    )]
    Mount {
        /// The mount point.
        path: PathBuf,
        /// The cause.
        #[source]
        source: nix::Error,
    },
    /// The pin root is not on bpffs.
    #[error(
        "pin root {path} is not on a bpf filesystem; choose a --bpf-root below a bpffs mount such as /sys/fs/bpf"
    )]
    NotBpffs {
        /// The pin root.
        path: PathBuf,
    },
    /// Creating a directory failed.
    #[error("cannot create {path}: {source}")]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// True when `path` is on a bpf filesystem.
pub fn is_bpffs(path: &Path) -> Result<bool, BpffsError> {
    let stat = statfs(path).map_err(|source| BpffsError::Stat {
        path: path.to_owned(),
        source,
    })?;
    Ok(stat.filesystem_type() == BPF_FS_MAGIC)
}

/// Mounts bpffs at `mount_point` unless it is mounted already (as Cilium does at start-up).
pub fn ensure_mounted(mount_point: &Path) -> Result<(), BpffsError> {
    if is_bpffs(mount_point)? {
        return Ok(());
    }
    mount(
        Some("bpf"),
        mount_point,
        Some("bpf"),
        MsFlags::empty(),
        None::<&str>,
    )
    .map_err(|source| BpffsError::Mount {
        path: mount_point.to_owned(),
        source,
    })?;
    tracing::info!(path = %mount_point.display(), "mounted bpffs");
    Ok(())
}

/// Creates `dir` (and its parents) with mode 0700 and checks it is on bpffs.
pub fn ensure_pin_dir(dir: &Path) -> Result<(), BpffsError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| BpffsError::CreateDir {
            path: dir.to_owned(),
            source,
        })?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(|source| {
        BpffsError::CreateDir {
            path: dir.to_owned(),
            source,
        }
    })?;
    if !is_bpffs(dir)? {
        return Err(BpffsError::NotBpffs {
            path: dir.to_owned(),
        });
    }
    Ok(())
}

/// Pins something at `path` by pinning it at `<path>_new` with `pin` and renaming that over
/// `path`, so the path never disappears and an older pin there is replaced (dropping what it
/// held once nothing else does). A staging pin left by an interrupted earlier call is removed
/// first.
pub fn pin_by_rename(path: &Path, pin: impl FnOnce(&Path) -> io::Result<()>) -> io::Result<()> {
    let mut staging = path.as_os_str().to_owned();
    staging.push("_new");
    let staging = PathBuf::from(staging);
    match fs::remove_file(&staging) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    pin(&staging)?;
    fs::rename(&staging, path)
}
