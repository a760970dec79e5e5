//! The `--routing vxlan` flags (`--vxlan-device`, `--vxlan-vni`, `--vxlan-port`, `--vxlan-underlay`), each
//! with its environment variable and a default from `paths`, as a `clap` group that `config::AgentArgs`
//! flattens (`#[command(flatten)] pub vxlan: VxlanArgs`), validated into the VXLAN driver's
//! [`VxlanConfig`].

use clap::Args;
use serde::Serialize;

use crate::{config::ConfigError, dataplane::vxlan::VxlanConfig, paths};

/// The VXLAN device's settings.
#[derive(Debug, Clone, Args, Serialize, PartialEq, Eq)]
pub struct VxlanArgs {
    /// Name of the VXLAN device of `--routing vxlan` (never starting with `weir`, which means a
    /// workload veth; at most 15 characters).
    #[arg(long = "vxlan-device", env = "WEIR_VXLAN_DEVICE", default_value = paths::DEFAULT_VXLAN_DEVICE)]
    pub device: String,
    /// The VXLAN network identifier every node uses (1 to 16777215).
    #[arg(long = "vxlan-vni", env = "WEIR_VXLAN_VNI", default_value_t = paths::DEFAULT_VXLAN_VNI)]
    pub vni: u32,
    /// The UDP port of the tunnel on every node.
    #[arg(long = "vxlan-port", env = "WEIR_VXLAN_PORT", default_value_t = paths::DEFAULT_VXLAN_PORT)]
    pub port: u16,
    /// The underlay device the tunnel's packets leave through (the one holding this node's address);
    /// the device's MTU is this device's less 50 bytes, and pods get that MTU.
    #[arg(long = "vxlan-underlay", env = "WEIR_VXLAN_UNDERLAY")]
    pub underlay: Option<String>,
}

fn invalid(flag: &'static str, value: &str, reason: &str) -> ConfigError {
    ConfigError::Invalid {
        flag,
        value: value.to_owned(),
        reason: reason.to_owned(),
    }
}

impl VxlanArgs {
    /// Checks the settings that need nothing from the kernel (device name, VNI, port, an underlay given
    /// empty): what `config::AgentArgs::validate` refuses before anything starts.
    pub fn check(&self) -> Result<(), ConfigError> {
        let d = &self.device;
        if d.is_empty() || d.len() > 15 || d.contains(['/', ' ', ':']) || d.starts_with("weir") {
            return Err(invalid(
                "--vxlan-device (WEIR_VXLAN_DEVICE)",
                d,
                "use a link name of 1 to 15 characters, without '/', ':' or spaces, not starting with `weir` (workload veths)",
            ));
        }
        if !(1..=0x00ff_ffff).contains(&self.vni) {
            return Err(invalid(
                "--vxlan-vni (WEIR_VXLAN_VNI)",
                &self.vni.to_string(),
                "use a VNI from 1 to 16777215",
            ));
        }
        if self.port == 0 {
            return Err(invalid(
                "--vxlan-port (WEIR_VXLAN_PORT)",
                "0",
                "use a UDP port from 1 to 65535 (4789 is VXLAN's)",
            ));
        }
        if self.underlay.as_deref() == Some("") {
            return Err(invalid(
                "--vxlan-underlay (WEIR_VXLAN_UNDERLAY)",
                "",
                "name the device that holds this node's address, or leave the flag out to use that device",
            ));
        }
        Ok(())
    }

    /// The driver's settings; `underlay` is used when `--vxlan-underlay` is not given (the device of this
    /// node's address, found by the caller).
    pub fn validate(&self, underlay: Option<&str>) -> Result<VxlanConfig, ConfigError> {
        self.check()?;
        let underlay = self
            .underlay
            .as_deref()
            .or(underlay)
            .filter(|u| !u.is_empty())
            .ok_or_else(|| {
                invalid(
                    "--vxlan-underlay (WEIR_VXLAN_UNDERLAY)",
                    "",
                    "name the device that holds this node's address",
                )
            })?;
        Ok(VxlanConfig {
            device: self.device.clone(),
            vni: self.vni,
            port: self.port,
            underlay: underlay.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        vxlan: VxlanArgs,
    }

    fn parse(args: &[&str]) -> VxlanArgs {
        Cli::try_parse_from(std::iter::once("weir").chain(args.iter().copied()))
            .expect("parse")
            .vxlan
    }

    #[test]
    fn defaults_come_from_paths_and_flags_override_them() {
        let d = parse(&[]);
        assert_eq!(
            d.validate(Some("eth0")).expect("valid"),
            VxlanConfig {
                device: paths::DEFAULT_VXLAN_DEVICE.into(),
                vni: paths::DEFAULT_VXLAN_VNI,
                port: paths::DEFAULT_VXLAN_PORT,
                underlay: "eth0".into(),
            }
        );
        let c = parse(&[
            "--vxlan-device",
            "tun9",
            "--vxlan-vni",
            "7",
            "--vxlan-port",
            "8472",
            "--vxlan-underlay",
            "ens3",
        ])
        .validate(Some("eth0"))
        .expect("valid");
        assert_eq!(
            (c.device.as_str(), c.vni, c.port, c.underlay.as_str()),
            ("tun9", 7, 8472, "ens3")
        );
    }

    #[test]
    fn bad_values_name_the_flag_and_the_fix() {
        for (args, flag) in [
            (&["--vxlan-device", "weirvx"][..], "--vxlan-device"),
            (
                &["--vxlan-device", "a-name-longer-than-15"][..],
                "--vxlan-device",
            ),
            (&["--vxlan-vni", "0"][..], "--vxlan-vni"),
            (&["--vxlan-vni", "16777216"][..], "--vxlan-vni"),
            (&["--vxlan-port", "0"][..], "--vxlan-port"),
        ] {
            let err = parse(args)
                .validate(Some("eth0"))
                .expect_err("invalid")
                .to_string();
            assert!(err.contains(flag), "{args:?}: {err}");
        }
        let err = parse(&["--vxlan-underlay", ""])
            .check()
            .expect_err("an empty underlay")
            .to_string();
        assert!(err.contains("--vxlan-underlay"), "{err}");
        assert!(parse(&[]).check().is_ok(), "no underlay: found at start");
        let err = parse(&[])
            .validate(None)
            .expect_err("no underlay")
            .to_string();
        assert!(err.contains("--vxlan-underlay"), "{err}");
    }
}
