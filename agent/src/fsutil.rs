//! Durable file replacement: write a temporary file beside the target, fsync it, rename it over
//! the target, fsync the directory. A crash leaves either the old or the new content, never half.

use std::{
    fs,
    io::{self, Write as _},
    path::{Path, PathBuf},
};

fn temporary(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(".tmp");
    path.with_file_name(name)
}

/// Replaces `path` with `bytes` atomically and durably, creating its directory if needed.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    if let Some(dir) = dir {
        fs::create_dir_all(dir)?;
    }
    let tmp = temporary(path);
    let mut file = fs::File::create(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    fs::rename(&tmp, path)?;
    if let Some(dir) = dir {
        fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn replaces_whole_files() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("sub/state.json");
        super::write_atomic(&path, b"one").expect("first");
        super::write_atomic(&path, b"two").expect("second");
        assert_eq!(std::fs::read(&path).expect("read"), b"two");
        assert!(!path.with_file_name("state.json.tmp").exists());
    }
}
