//! weir's kernel programs. Thin entry points (`entry`) call `try_*` functions in modules.
#![no_std]
#![no_main]

// Conntrack keys are built as little-endian words and packet fields read as loaded (`parse::word`).
#[cfg(target_endian = "big")]
compile_error!("weir's programs are built for bpfel only");

mod counters;
#[cfg(feature = "debug-log")]
mod debug_log;
mod endpoint;
mod entry;
mod fib;
mod flow;
mod host_fwd;
mod ipv4;
mod ipv6;
mod l4;
mod maps;
mod masq;
mod nodeport;
mod parse;
mod policy;
mod prefilter;
#[cfg(feature = "verifier-reject")]
mod reject;
mod service;
mod service_related;
mod socket_lb;
mod trace;
mod unreachable;

/// A reachable panic loops forever, which the verifier rejects: no panic path can ship.
#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
