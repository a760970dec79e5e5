//! `weir-cni`: weir's CNI plugin (CNI 1.0.0 and 1.1.0: ADD, DEL, CHECK, VERSION, GC, STATUS).
//!
//! The runtime runs it with the CNI environment and the network configuration on stdin. It
//! allocates addresses and registers endpoints through the weir agent's API socket, builds the
//! pod's veth with netlink, and attaches the agent's pinned programs. The result or a CNI error
//! object goes to stdout; logs go to stderr and the log file. See `docs/cni.md`.

fn main() {
    std::process::exit(cni::run());
}
