//! The kernel's FIB, asked from a tc program (`bpf_fib_lookup`): NodePort forwarding and BPF host
//! routing (`host_fwd`) both send packets on by its answer.

use aya_ebpf::{
    EbpfContext as _, bindings::bpf_fib_lookup, helpers::bpf_fib_lookup as fib_lookup,
    programs::TcContext,
};

/// `AF_INET`.
const AF_INET: u8 = 2;
/// `bpf_fib_lookup` results: forwarded with the neighbour known, or with it unresolved.
pub(crate) const FIB_SUCCESS: i64 = 0;
pub(crate) const FIB_NO_NEIGH: i64 = 7;

/// The kernel's `struct bpf_fib_lookup` (64 bytes) as 64-bit words where it can be: the
/// compiler merges neighbouring stores into wider ones, and the verifier refuses a stack store that
/// is not aligned to its own size. `head`: family, L4 protocol (ports and length zero); `src` and
/// `dst`: an IPv4 address in the first four bytes; `tail`: the VLAN words, then the source and
/// destination MAC addresses the lookup fills in.
#[repr(C, align(8))]
pub(crate) struct Fib {
    head: u64,
    /// In: the interface the packet arrived on; out: the one the route leaves by.
    pub(crate) ifindex: u32,
    tos: u32,
    src: [u64; 2],
    dst: [u64; 2],
    tail: [u64; 2],
}

impl Fib {
    /// The MAC address `tail` holds at byte `at` (4: source, 10: destination), in place.
    #[inline(always)]
    pub(crate) fn mac(&self, at: usize) -> &[u8; 6] {
        // SAFETY: `at + 6 <= 16` for both callers: inside `tail`, byte-aligned data.
        unsafe { &*self.tail.as_ptr().cast::<u8>().add(at).cast::<[u8; 6]>() }
    }
}
const _: () = assert!(size_of::<Fib>() == size_of::<bpf_fib_lookup>());

/// The FIB's way from `src` to `dst` for a packet of protocol `proto` that arrived on `ifindex`
/// (an input lookup: the arriving interface's forwarding setting applies), with the lookup's
/// result code. The length is left zero, so the kernel checks the packet itself against the
/// egress MTU (a GSO packet passes).
#[inline(always)]
pub(crate) fn lookup(ctx: &TcContext, ifindex: u32, proto: u8, src: u32, dst: u32) -> (Fib, i64) {
    let mut fib = Fib {
        head: u64::from(AF_INET) | (u64::from(proto) << 8),
        ifindex,
        tos: 0,
        src: [u64::from(src), 0],
        dst: [u64::from(dst), 0],
        tail: [0; 2],
    };
    // SAFETY: `fib` is a valid `struct bpf_fib_lookup` of its size on this program's stack.
    let rc = unsafe {
        fib_lookup(
            ctx.as_ptr(),
            (&raw mut fib).cast::<bpf_fib_lookup>(),
            size_of::<Fib>() as i32,
            0,
        )
    };
    (fib, rc)
}
