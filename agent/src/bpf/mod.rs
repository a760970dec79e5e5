//! BPF object management: mounting bpffs and the pin directories (`bpffs`), loading the object
//! with its maps pinned by versioned name (`loader`), keeping or replacing the pinned programs
//! (`programs`), socket LB's cgroup links (`socket_lb`), and the conntrack layout migration (`migrate/`). The drivers that keep map
//! contents and attachments in step live in `dataplane/`.

pub mod bpffs;
pub mod loader;
pub mod migrate;
pub mod programs;
pub mod socket_lb;
