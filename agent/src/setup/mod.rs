//! What runs on the host outside BPF: the host's sysctls and the CNI configuration the runtime reads
//! (`host`), `weir install-cni` (`install_cni`) and `weir uninstall` (`uninstall`).

pub mod host;
pub mod install_cni;
pub mod uninstall;
