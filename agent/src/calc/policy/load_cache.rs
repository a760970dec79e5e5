//! The policy directory read again with only its changed files parsed: each file's documents are
//! kept with the stamp (modification time, length, inode) they were parsed at, and a file whose
//! stamp is unchanged is not read again. The result is the one `load::load_dir_full` gives: the
//! files in name order, a later file's object replacing an earlier file's of the same name.
//!
//! A directory of 20,000 documents in one file and a new small file beside it costs the small
//! file's parse, not 20,000 documents' (the standalone mode's one-Service update, BENCHMARKS.md).

use std::{
    collections::BTreeMap,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    time::SystemTime,
};

use super::load::{self, DocCache, Loaded};

/// What a file's parse is kept against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

fn stamp(file: &Path) -> Option<Stamp> {
    let meta = std::fs::metadata(file).ok()?;
    Some(Stamp {
        modified: meta.modified().ok(),
        len: meta.len(),
        inode: meta.ino(),
    })
}

/// Every readable file's parse, by path, and the parse of each of its documents (an edited
/// file parses only its documents that changed).
#[derive(Debug, Default)]
pub struct DirCache {
    files: BTreeMap<PathBuf, (Stamp, Loaded)>,
    documents: BTreeMap<PathBuf, DocCache>,
}

impl DirCache {
    /// Reads `dir` as `load::load_dir_full` does, parsing only the files that changed since this
    /// cache last saw them (stamped before the read: a change during it is seen next time).
    pub fn load(&mut self, dir: &Path) -> Loaded {
        // Rebuilt from the directory's files: a file gone from it leaves with the old map.
        let mut kept = std::mem::take(&mut self.files);
        let mut documents = std::mem::take(&mut self.documents);
        let mut all = Loaded::default();
        for file in load::policy_files(dir) {
            let now = stamp(&file);
            let parsed = match (now, kept.remove(&file)) {
                (Some(now), Some((then, parsed))) if then == now => parsed,
                _ => {
                    let mut parsed = Loaded::default();
                    let docs = documents.entry(file.clone()).or_default();
                    if !load::load_file_with(&file, Some(docs), &mut parsed) {
                        // Unreadable: reported now, read again next time.
                        merge_file(&mut all, &parsed);
                        continue;
                    }
                    parsed
                }
            };
            merge_file(&mut all, &parsed);
            if let Some(docs) = documents.remove(&file) {
                self.documents.insert(file.clone(), docs);
            }
            // A file that vanished after its read is read again (or left out) next time.
            if let Some(now) = now {
                self.files.insert(file, (now, parsed));
            }
        }
        load::with_warnings(all)
    }
}

/// Adds one file's parse after the files before it: its objects replace theirs (a Namespace
/// with its `weir.dev/` annotations, or without any), its reports follow theirs.
fn merge_file(all: &mut Loaded, file: &Loaded) {
    load::merge_document(all, file, 0);
}

#[cfg(test)]
#[path = "load_cache_tests.rs"]
mod tests;
