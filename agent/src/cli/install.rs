//! `weir install-cni` and `weir mount-bpffs` (the DaemonSet's init steps) and `weir uninstall` (a clean removal from a
//! node, as `cilium-dbg cleanup`). Both run on the node, without the agent.

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::Args;

use agent::{
    paths,
    setup::{install_cni, uninstall},
};

/// `weir install-cni`.
#[derive(Debug, Args)]
pub struct InstallCniArgs {
    /// The node's CNI bin directory (`/opt/cni/bin`, mounted from the host).
    #[arg(long, env = "WEIR_CNI_BIN_DIR", default_value = install_cni::DEFAULT_CNI_BIN_DIR)]
    pub cni_bin_dir: PathBuf,
    /// The plugin binary to install (default: `weir-cni` beside this `weir`).
    #[arg(long)]
    pub source: Option<PathBuf>,
}

/// Copies weir-cni into the CNI bin directory atomically.
pub fn install_cni(args: &InstallCniArgs) -> Result<()> {
    let source = args
        .source
        .clone()
        .unwrap_or_else(install_cni::default_source);
    let installed = install_cni::install(&source, &args.cni_bin_dir)?;
    println!(
        "installed {} from {}",
        installed.display(),
        source.display()
    );
    Ok(())
}

/// Mounts bpffs at `/sys/fs/bpf` when it is not mounted (the DaemonSet's privileged init step,
/// whose mount propagates to the host so that the pins outlive every container).
pub fn mount_bpffs() -> Result<()> {
    agent::kernel::real::bpffs::ensure_mounted(std::path::Path::new(paths::BPFFS_MOUNT))?;
    println!("bpffs is mounted at {}", paths::BPFFS_MOUNT);
    Ok(())
}

/// `weir uninstall`.
#[derive(Debug, Args)]
pub struct UninstallArgs {
    /// The agent's pin root (removed).
    #[arg(long, env = "WEIR_BPF_ROOT", default_value = paths::DEFAULT_BPF_ROOT)]
    pub bpf_root: PathBuf,
    /// Where the agent wrote its conflist (`04-weir.conflist` is removed; nothing else).
    #[arg(long, env = "WEIR_CNI_CONF_DIR", default_value = paths::DEFAULT_CNI_CONF_DIR)]
    pub cni_conf_dir: PathBuf,
    /// The agent's API socket (a running agent there refuses the uninstall).
    #[arg(long, env = "WEIR_API_SOCKET", default_value = paths::DEFAULT_API_SOCKET)]
    pub api_socket: PathBuf,
    /// Print what was removed as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Removes the conflist, detaches weir's programs and removes the pin root.
pub fn uninstall(args: &UninstallArgs) -> Result<()> {
    let root = &args.bpf_root;
    if !root.is_absolute()
        || !root.starts_with(paths::BPFFS_MOUNT)
        || root == std::path::Path::new(paths::BPFFS_MOUNT)
    {
        bail!(
            "invalid --bpf-root {}: must be an absolute directory below {}",
            root.display(),
            paths::BPFFS_MOUNT
        );
    }
    let paths = paths::Paths {
        bpf_root: root.clone(),
        api_socket: args.api_socket.clone(),
        cni_conf_dir: args.cni_conf_dir.clone(),
        ..paths::Paths::default()
    };
    let report = uninstall::run(&paths)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    match &report.conflist {
        Some(path) => println!("removed {}", path.display()),
        None => println!("no conflist in {}", args.cni_conf_dir.display()),
    }
    println!(
        "deleted {} tc filters: {:?}",
        report.filters.len(),
        report.filters
    );
    println!("unpinned {} links: {:?}", report.links.len(), report.links);
    match &report.pin_root {
        Some(path) => println!("removed the pin root {}", path.display()),
        None => println!("no pin root at {}", root.display()),
    }
    Ok(())
}
