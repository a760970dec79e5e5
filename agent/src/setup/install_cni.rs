//! `weir install-cni`: the DaemonSet's init step. Copies the `weir-cni` binary into the node's
//! CNI bin directory atomically — a temporary file in that directory, written, made executable and
//! synced, then renamed over `weir-cni` — so a runtime exec'ing the plugin meanwhile runs either
//! the old binary or the new one, never half a file. Nothing else in the directory is touched:
//! other plugins' files stay, and only weir's own temporary name is ever removed.

use std::{
    fs,
    io::{self, Write as _},
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
};

/// The plugin's file name (the conflist's `type`).
pub const PLUGIN: &str = "weir-cni";
/// The default CNI bin directory.
pub const DEFAULT_CNI_BIN_DIR: &str = "/opt/cni/bin";

/// Errors of the install.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// The source binary is missing or unreadable.
    #[error(
        "cannot read the plugin binary {path}: {source}; pass --source or install weir-cni beside weir"
    )]
    Source {
        /// The binary.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The destination could not be written.
    #[error(
        "cannot install {path}: {source}; check that --cni-bin-dir is the node's CNI bin directory, mounted writable"
    )]
    Write {
        /// The file being written.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// The `weir-cni` beside the running executable (`/weir-cni` in the image).
#[must_use]
pub fn default_source() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join(PLUGIN)))
        .unwrap_or_else(|| PathBuf::from("/").join(PLUGIN))
}

/// Copies `source` to `<bin_dir>/weir-cni` atomically; returns the installed path.
pub fn install(source: &Path, bin_dir: &Path) -> Result<PathBuf, InstallError> {
    let bytes = fs::read(source).map_err(|e| InstallError::Source {
        path: source.to_owned(),
        source: e,
    })?;
    let target = bin_dir.join(PLUGIN);
    // A name of weir's own in the same directory (so the rename stays on one file system).
    let tmp = bin_dir.join(format!(".{PLUGIN}.tmp{}", std::process::id()));
    let write = |path: &Path| -> io::Result<()> {
        fs::create_dir_all(bin_dir)?;
        let mut file = fs::File::create(path)?;
        file.write_all(&bytes)?;
        file.set_permissions(fs::Permissions::from_mode(0o755))?;
        file.sync_all()
    };
    if let Err(e) = write(&tmp) {
        let _ = fs::remove_file(&tmp);
        return Err(InstallError::Write {
            path: tmp,
            source: e,
        });
    }
    fs::rename(&tmp, &target).map_err(|e| {
        let _ = fs::remove_file(&tmp);
        InstallError::Write {
            path: target.clone(),
            source: e,
        }
    })?;
    fs::File::open(bin_dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| InstallError::Write {
            path: bin_dir.to_owned(),
            source: e,
        })?;
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn installs_over_the_old_binary_and_leaves_other_plugins_alone() {
        let dir = tempfile::tempdir().expect("tmp");
        let bin = dir.path().join("bin");
        fs::create_dir_all(&bin).expect("bin");
        fs::write(bin.join("bridge"), b"another plugin").expect("bridge");
        fs::write(bin.join(PLUGIN), b"old weir-cni").expect("old");
        let source = dir.path().join("new");
        fs::write(&source, b"new weir-cni").expect("source");
        let installed = install(&source, &bin).expect("install");
        assert_eq!(fs::read(&installed).expect("read"), b"new weir-cni");
        let mode = fs::metadata(&installed).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o755, "executable");
        assert_eq!(
            fs::read(bin.join("bridge")).expect("bridge"),
            b"another plugin"
        );
        let mut names: Vec<_> = fs::read_dir(&bin)
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        names.sort();
        assert_eq!(names, ["bridge", PLUGIN], "no temporary file is left");
    }

    #[test]
    fn a_missing_source_names_it_and_writes_nothing() {
        let dir = tempfile::tempdir().expect("tmp");
        let err = install(&dir.path().join("nope"), &dir.path().join("bin"))
            .expect_err("no source")
            .to_string();
        assert!(err.contains("nope"), "{err}");
        assert!(!dir.path().join("bin").exists());
    }
}
