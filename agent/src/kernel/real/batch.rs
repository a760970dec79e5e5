//! Batch map operations (`BPF_MAP_LOOKUP_BATCH`, `BPF_MAP_DELETE_BATCH`) on a map's fd: aya 0.16
//! has none, and walking a large map entry by entry costs 2–3 syscalls per entry.
//!
//! Keys and values are `bytemuck::Pod` (every `maps-schema` map type derives it, which checks at
//! compile time that it has no padding), so buffers are built and read with safe casts; `unsafe`
//! is confined to the syscall layer below (the call itself and the kernel's `bpf_attr` union).
//!
//! The same layer serves link pins: the interface of a pinned XDP link, and a synchronous detach.

use std::{
    io,
    mem::size_of,
    os::fd::{AsRawFd as _, BorrowedFd},
};

use aya_obj::generated::{bpf_attr, bpf_cmd, bpf_map_info};
use bytemuck::Pod;

/// Entries fetched per syscall.
const CHUNK: u32 = 4096;

/// An all-zero `bpf_attr` (what every command expects in the fields it does not use).
fn new_attr() -> bpf_attr {
    // SAFETY: `bpf_attr` is a C union of integers and integer arrays: all-zero is valid.
    unsafe { std::mem::zeroed() }
}

/// The count a batch command wrote back (how many entries it processed).
fn batch_count(attr: &bpf_attr) -> usize {
    // SAFETY: batch commands use the `batch` member, and the kernel writes `count` back.
    unsafe { attr.batch.count as usize }
}

fn bpf(cmd: bpf_cmd, attr: &mut bpf_attr) -> io::Result<()> {
    bpf_rc(cmd, attr).map(drop)
}

/// The syscall; its non-negative result (a new fd for `BPF_OBJ_GET`).
fn bpf_rc(cmd: bpf_cmd, attr: &mut bpf_attr) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a valid, fully initialised `bpf_attr` for `cmd`, and every pointer inside
    // it points at a buffer large enough for the count it states.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd as libc::c_long,
            std::ptr::from_mut(attr),
            size_of::<bpf_attr>(),
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// Every (key, value) of a hash map, `CHUNK` at a time.
pub fn lookup_all<K: Pod, V: Pod>(fd: BorrowedFd<'_>) -> io::Result<Vec<(K, V)>> {
    check::<K, V>(fd, false)?;
    lookup_batches(fd, size_of::<V>())
}

/// The value size of the map behind `fd` (`BPF_OBJ_GET_INFO_BY_FD`).
pub fn value_size(fd: BorrowedFd<'_>) -> io::Result<usize> {
    sizes(fd).map(|(_, v)| v)
}

/// Refuses a map whose key size differs from `K`'s, or whose value size differs from `V`'s
/// (is smaller than it, with `prefix`): the kernel copies by the map's sizes, so a map of another
/// layout would read or write past the buffers. Every batch operation here checks first.
pub fn check<K, V>(fd: BorrowedFd<'_>, prefix: bool) -> io::Result<()> {
    let (key, value) = sizes(fd)?;
    let value_ok = if prefix {
        value >= size_of::<V>()
    } else {
        value == size_of::<V>()
    };
    if key == size_of::<K>() && value_ok {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "the map has {key}-byte keys and {value}-byte values, not the expected {} and {}: it belongs to another layout",
                size_of::<K>(),
                size_of::<V>()
            ),
        ))
    }
}

/// (key size, value size) of the map behind `fd` (`BPF_OBJ_GET_INFO_BY_FD`).
pub fn sizes(fd: BorrowedFd<'_>) -> io::Result<(usize, usize)> {
    let [key, value, _] = info_fields(fd)?;
    Ok((key as usize, value as usize))
}

/// The capacity of the map behind `fd` (`BPF_OBJ_GET_INFO_BY_FD`).
pub fn max_entries(fd: BorrowedFd<'_>) -> io::Result<u32> {
    info_fields(fd).map(|[_, _, max]| max)
}

/// (key size, value size, max entries) of the map behind `fd`.
fn info_fields(fd: BorrowedFd<'_>) -> io::Result<[u32; 3]> {
    // The info is read into plain bytes (the struct has no `Pod`) and its fields taken from
    // their offsets.
    let mut info = vec![0u8; size_of::<bpf_map_info>()];
    let mut attr = new_attr();
    attr.info.bpf_fd = u32::try_from(fd.as_raw_fd()).unwrap_or_default();
    attr.info.info_len = u32::try_from(info.len()).unwrap_or(0);
    attr.info.info = info.as_mut_ptr() as u64;
    bpf(bpf_cmd::BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
    let field = |offset: usize| {
        bytemuck::pod_read_unaligned::<u32>(&info[offset..offset + size_of::<u32>()])
    };
    Ok([
        field(std::mem::offset_of!(bpf_map_info, key_size)),
        field(std::mem::offset_of!(bpf_map_info, value_size)),
        field(std::mem::offset_of!(bpf_map_info, max_entries)),
    ])
}

/// Every (key, value prefix) of a hash map whose values are `value_size` bytes, `value_size` ≥
/// `size_of::<V>()`: the first `size_of::<V>()` bytes of each value, read as `V` (for maps of a
/// newer layout, whose values start with the layout this release knows).
pub fn lookup_all_prefix<K: Pod, V: Pod>(
    fd: BorrowedFd<'_>,
    value_size: usize,
) -> io::Result<Vec<(K, V)>> {
    check::<K, V>(fd, true)?;
    if value_size != self::value_size(fd)? {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the map's values are not {value_size} bytes"),
        ));
    }
    lookup_batches(fd, value_size)
}

/// `BPF_MAP_LOOKUP_BATCH` over the whole map, values of `value_size` bytes (checked by the
/// caller), each read as its first `size_of::<V>()` bytes.
fn lookup_batches<K: Pod, V: Pod>(
    fd: BorrowedFd<'_>,
    value_size: usize,
) -> io::Result<Vec<(K, V)>> {
    let mut out = Vec::new();
    let token_len = size_of::<K>().max(8);
    let mut in_token = vec![0u8; token_len];
    let mut out_token = vec![0u8; token_len];
    let mut keys: Vec<K> = vec![K::zeroed(); CHUNK as usize];
    let mut values = vec![0u8; CHUNK as usize * value_size];
    let mut first = true;
    loop {
        let mut attr = new_attr();
        attr.batch.in_batch = if first { 0 } else { in_token.as_ptr() as u64 };
        attr.batch.out_batch = out_token.as_mut_ptr() as u64;
        attr.batch.keys = keys.as_mut_ptr() as u64;
        attr.batch.values = values.as_mut_ptr() as u64;
        attr.batch.count = CHUNK;
        attr.batch.map_fd = u32::try_from(fd.as_raw_fd()).unwrap_or_default();
        let result = bpf(bpf_cmd::BPF_MAP_LOOKUP_BATCH, &mut attr);
        let count = batch_count(&attr);
        for (key, value) in keys[..count].iter().zip(values.chunks_exact(value_size)) {
            out.push((*key, bytemuck::pod_read_unaligned(&value[..size_of::<V>()])));
        }
        match result {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(out),
            Err(e) => return Err(e),
        }
        in_token.copy_from_slice(&out_token);
        first = false;
    }
}

/// Deletes `keys` (missing ones are skipped), `CHUNK` at a time. Returns how many were deleted.
pub fn delete<K: Pod>(fd: BorrowedFd<'_>, keys: &[K]) -> io::Result<usize> {
    let (key, _) = sizes(fd)?;
    if key != size_of::<K>() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the map has {key}-byte keys, not {}", size_of::<K>()),
        ));
    }
    let mut deleted = 0;
    for chunk in keys.chunks(CHUNK as usize) {
        let keys: &[u8] = bytemuck::cast_slice(chunk);
        let mut attr = new_attr();
        attr.batch.keys = keys.as_ptr() as u64;
        attr.batch.count = u32::try_from(chunk.len()).unwrap_or(CHUNK);
        attr.batch.map_fd = u32::try_from(fd.as_raw_fd()).unwrap_or_default();
        match bpf(bpf_cmd::BPF_MAP_DELETE_BATCH, &mut attr) {
            Ok(()) => deleted += batch_count(&attr),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                // An entry vanished meanwhile (LRU or the programs): delete the rest one by one.
                let done = batch_count(&attr);
                deleted += done;
                for key in &chunk[done..] {
                    let mut attr = new_attr();
                    attr.__bindgen_anon_2.map_fd =
                        u32::try_from(fd.as_raw_fd()).unwrap_or_default();
                    attr.__bindgen_anon_2.key = std::ptr::from_ref(key) as u64;
                    if bpf(bpf_cmd::BPF_MAP_DELETE_ELEM, &mut attr).is_ok() {
                        deleted += 1;
                    }
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(deleted)
}

/// Creates or replaces `entries`, `CHUNK` at a time (`BPF_MAP_UPDATE_BATCH`, `BPF_ANY`).
pub fn update<K: Pod, V: Pod>(fd: BorrowedFd<'_>, entries: &[(K, V)]) -> io::Result<usize> {
    check::<K, V>(fd, false)?;
    let mut written = 0;
    for chunk in entries.chunks(CHUNK as usize) {
        let keys: Vec<K> = chunk.iter().map(|(k, _)| *k).collect();
        let values: Vec<V> = chunk.iter().map(|(_, v)| *v).collect();
        let (keys, values): (&[u8], &[u8]) =
            (bytemuck::cast_slice(&keys), bytemuck::cast_slice(&values));
        let mut attr = new_attr();
        attr.batch.keys = keys.as_ptr() as u64;
        attr.batch.values = values.as_ptr() as u64;
        attr.batch.count = u32::try_from(chunk.len()).unwrap_or(CHUNK);
        attr.batch.map_fd = u32::try_from(fd.as_raw_fd()).unwrap_or_default();
        let result = bpf(bpf_cmd::BPF_MAP_UPDATE_BATCH, &mut attr);
        written += batch_count(&attr);
        result?;
    }
    Ok(written)
}

/// One entry (`BPF_MAP_LOOKUP_ELEM`), `None` when absent. Unchecked (it runs per key): call
/// [`check`] on the map first.
pub fn lookup<K: Pod, V: Pod>(fd: BorrowedFd<'_>, key: &K) -> io::Result<Option<V>> {
    let mut value = V::zeroed();
    let mut attr = new_attr();
    attr.__bindgen_anon_2.map_fd = u32::try_from(fd.as_raw_fd()).unwrap_or_default();
    attr.__bindgen_anon_2.key = bytemuck::bytes_of(key).as_ptr() as u64;
    attr.__bindgen_anon_2.__bindgen_anon_1.value =
        bytemuck::bytes_of_mut(&mut value).as_mut_ptr() as u64;
    match bpf(bpf_cmd::BPF_MAP_LOOKUP_ELEM, &mut attr) {
        Ok(()) => Ok(Some(value)),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// How many entries a hash map holds (keys only, `CHUNK` at a time).
pub fn count<K: Pod, V: Pod>(fd: BorrowedFd<'_>) -> io::Result<usize> {
    lookup_all::<K, V>(fd).map(|all| all.len())
}

/// Opens the object pinned at `pin` (`BPF_OBJ_GET`).
fn obj_get(pin: &std::path::Path) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::{fd::FromRawFd as _, unix::ffi::OsStrExt as _};
    let path = std::ffi::CString::new(pin.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mut attr = new_attr();
    attr.__bindgen_anon_4.pathname = path.as_ptr() as u64;
    // `path` outlives the call.
    let rc = bpf_rc(bpf_cmd::BPF_OBJ_GET, &mut attr)?;
    let raw = i32::try_from(rc).map_err(|_| io::Error::other("bpf() returned no fd"))?;
    // SAFETY: the kernel just returned this new fd; nothing else owns it.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) })
}

/// The interface index the XDP link pinned at `pin` runs on (`BPF_OBJ_GET`, then
/// `BPF_OBJ_GET_INFO_BY_FD`); 0 once its interface is gone (the link is then defunct).
pub fn xdp_link_ifindex(pin: &std::path::Path) -> io::Result<u32> {
    let fd = obj_get(pin)?;
    // SAFETY: `bpf_link_info` is a C struct of integers and a union of integer structs: all-zero
    // is valid.
    let mut info: aya_obj::generated::bpf_link_info = unsafe { std::mem::zeroed() };
    let mut attr = new_attr();
    attr.info.bpf_fd = u32::try_from(fd.as_raw_fd()).unwrap_or_default();
    attr.info.info_len = u32::try_from(size_of::<aya_obj::generated::bpf_link_info>()).unwrap_or(0);
    attr.info.info = std::ptr::from_mut(&mut info) as u64;
    bpf(bpf_cmd::BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
    // SAFETY: for an XDP link the kernel fills the `xdp` member of the union.
    Ok(unsafe { info.__bindgen_anon_1.xdp.ifindex })
}

/// Detaches the bpf link pinned at `pin` now (`BPF_LINK_DETACH`), then removes the pin; a pin
/// that is not there is already gone.
///
/// Removing a link's last pin alone frees the link only after an RCU grace period and a kernel
/// work item, so for a while the program still runs on the hook; the detach makes it leave before
/// this returns (what a reconcile that then reports "detached" means). A link that cannot be
/// detached (a kernel without `BPF_LINK_DETACH`, a link whose interface is gone) still loses its
/// pin, which frees it as before.
pub fn detach_link_pin(pin: &std::path::Path) -> io::Result<()> {
    match obj_get(pin) {
        Ok(fd) => {
            let mut attr = new_attr();
            attr.link_detach.link_fd = u32::try_from(fd.as_raw_fd()).unwrap_or_default();
            if let Err(e) = bpf(bpf_cmd::BPF_LINK_DETACH, &mut attr) {
                tracing::debug!(pin = %pin.display(), error = %e, "cannot detach the link; removing its pin frees it");
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        // Not a link this process may open: the pin still goes.
        Err(e) => {
            tracing::debug!(pin = %pin.display(), error = %e, "cannot open the link pin; removing it");
        }
    }
    match std::fs::remove_file(pin) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}
