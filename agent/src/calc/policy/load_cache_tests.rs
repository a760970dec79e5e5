use std::{fs, path::Path};

use super::DirCache;
use crate::calc::policy::load::load_dir_full;

const NS_ANNOTATED: &str = "kind: Namespace\nmetadata: {name: prod, labels: {team: a}, annotations: {weir.dev/ipv4-pools: blue}}\n";
const NS_PLAIN: &str = "kind: Namespace\nmetadata: {name: prod, labels: {team: b}}\n";
const SERVICE: &str = "kind: Service\nmetadata: {name: web, namespace: prod}\nspec: {clusterIP: 10.96.0.10, ports: [{port: 80, protocol: TCP}]}\n";
const BAD: &str = "kind: Pod\nmetadata: {name: broken, namespace: prod}\nspec: [not, a, pod]\n";

/// Writes `name` aside and renames it in, as operators are asked to.
fn put(dir: &Path, name: &str, text: &str) {
    let aside = dir.join(format!(".{name}.tmp"));
    fs::write(&aside, text).expect("write");
    fs::rename(&aside, dir.join(name)).expect("rename");
}

/// The cache's read and a full read agree.
fn agree(cache: &mut DirCache, dir: &Path) {
    assert_eq!(cache.load(dir), load_dir_full(dir));
}

#[test]
fn reads_with_the_cache_equal_full_reads_through_adds_edits_and_removals() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cache = DirCache::default();
    agree(&mut cache, dir.path());
    put(dir.path(), "a.yaml", NS_ANNOTATED);
    agree(&mut cache, dir.path());
    // A later file's Namespace without annotations replaces the earlier one's, annotations too.
    put(dir.path(), "b.yaml", &format!("{NS_PLAIN}---\n{SERVICE}"));
    agree(&mut cache, dir.path());
    let loaded = cache.load(dir.path());
    assert_eq!(loaded.set.namespaces["prod"]["team"], "b");
    assert!(!loaded.set.namespace_annotations.contains_key("prod"));
    // A refused document and an edit of the first file.
    put(dir.path(), "c.yaml", BAD);
    put(dir.path(), "a.yaml", SERVICE);
    agree(&mut cache, dir.path());
    assert_eq!(cache.load(dir.path()).errors.len(), 1);
    // A file removed takes its objects with it.
    fs::remove_file(dir.path().join("b.yaml")).expect("remove");
    agree(&mut cache, dir.path());
    fs::remove_file(dir.path().join("a.yaml")).expect("remove");
    agree(&mut cache, dir.path());
    assert!(cache.load(dir.path()).set.services.is_empty());
}

#[test]
fn an_unchanged_file_is_not_read_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("a.yaml");
    fs::write(&file, NS_ANNOTATED).expect("write");
    let mut cache = DirCache::default();
    let first = cache.load(dir.path());
    // The same length, inode and modification time, other bytes: only a read would see them.
    let modified = fs::metadata(&file)
        .and_then(|m| m.modified())
        .expect("mtime");
    fs::write(&file, NS_ANNOTATED.replace("team: a", "team: z")).expect("rewrite");
    fs::File::options()
        .write(true)
        .open(&file)
        .and_then(|f| f.set_modified(modified))
        .expect("set mtime");
    assert_eq!(cache.load(dir.path()), first, "kept, not read again");
    assert_eq!(
        load_dir_full(dir.path()).set.namespaces["prod"]["team"],
        "z",
        "a full read sees the bytes"
    );
}
