//! Returns the heap's free pages to the kernel after a large apply. A first converge (or a resync)
//! builds transient buffers — batch buffers, dirty sets, the previous calculation's tables — and
//! glibc's allocator keeps their freed pages resident; `malloc_trim` gives them back, so the
//! agent's RSS is what it holds, not what its largest apply once needed.

/// Writes of one apply after which the free heap is returned (a small change frees little).
pub const TRIM_AFTER_WRITES: u64 = 10_000;

/// Returns the allocator's free memory to the kernel (glibc; elsewhere, e.g. the static musl
/// image, a no-op: musl's allocator returns large frees itself).
pub fn release_free() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `malloc_trim` only walks glibc's own arenas under their locks; it takes no
        // pointers and has no preconditions.
        unsafe {
            libc::malloc_trim(0);
        }
    }
}
