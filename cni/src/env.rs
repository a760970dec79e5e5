//! The CNI environment: `CNI_COMMAND`, `CNI_CONTAINERID`, `CNI_NETNS`, `CNI_IFNAME`, `CNI_ARGS`,
//! `CNI_PATH`, validated the way the spec (and libcni's skel) does.

use std::{collections::BTreeMap, net::IpAddr, path::PathBuf};

use crate::error::{CniCode, Code};

/// The operation the runtime asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Attach a container.
    Add,
    /// Detach a container (idempotent).
    Del,
    /// Compare a container with its ADD result.
    Check,
    /// Report the supported versions.
    Version,
    /// Release every attachment the runtime does not list (CNI 1.1).
    Gc,
    /// Say whether ADD can be served (CNI 1.1).
    Status,
}

impl Command {
    /// Parses `CNI_COMMAND`.
    fn parse(value: &str) -> Option<Self> {
        Some(match value {
            "ADD" => Self::Add,
            "DEL" => Self::Del,
            "CHECK" => Self::Check,
            "VERSION" => Self::Version,
            "GC" => Self::Gc,
            "STATUS" => Self::Status,
            _ => return None,
        })
    }
}

/// Errors in the environment (CNI code 4).
#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    /// A required variable is missing or empty.
    #[error("{var} is not set; the runtime must set it for {command}")]
    Missing {
        /// The variable.
        var: &'static str,
        /// The command that needs it.
        command: &'static str,
    },
    /// A variable has a value weir-cni cannot use.
    #[error("{var}={value:?} is not valid: {reason}")]
    Invalid {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
}

impl CniCode for EnvError {
    fn code(&self) -> Code {
        Code::InvalidEnvironment
    }
}

/// `CNI_ARGS` (`K=V;K2=V2`); unknown keys are accepted (with or without `IgnoreUnknown`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniArgs {
    pairs: BTreeMap<String, String>,
}

impl CniArgs {
    /// Parses the variable's value.
    pub fn parse(value: &str) -> Result<Self, EnvError> {
        let mut pairs = BTreeMap::new();
        for part in value.split(';').filter(|p| !p.is_empty()) {
            let Some((key, val)) = part.split_once('=') else {
                return Err(invalid(
                    "CNI_ARGS",
                    value,
                    format!("{part:?} is not KEY=VALUE; separate pairs with ';'"),
                ));
            };
            if key.is_empty() {
                return Err(invalid(
                    "CNI_ARGS",
                    value,
                    format!("{part:?} has an empty key"),
                ));
            }
            pairs.insert(key.to_owned(), val.to_owned());
        }
        Ok(Self { pairs })
    }

    /// The value of `key`, when present and non-empty.
    #[must_use]
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    /// `K8S_POD_NAMESPACE`.
    #[must_use]
    pub fn pod_namespace(&self) -> Option<&str> {
        self.get("K8S_POD_NAMESPACE")
    }

    /// `K8S_POD_NAME`.
    #[must_use]
    pub fn pod_name(&self) -> Option<&str> {
        self.get("K8S_POD_NAME")
    }

    /// `IP=a[,b]`: requested addresses (Calico's convention).
    pub fn ips(&self) -> Result<Vec<IpAddr>, EnvError> {
        let Some(value) = self.get("IP") else {
            return Ok(Vec::new());
        };
        value
            .split(',')
            .map(|s| {
                let s = s.trim();
                // Accept "10.0.0.5" and "10.0.0.5/32"; the prefix length is ours to choose.
                let addr = s.split_once('/').map_or(s, |(a, _)| a);
                addr.parse::<IpAddr>().map_err(|e| {
                    invalid(
                        "CNI_ARGS",
                        &format!("IP={value}"),
                        format!("{s:?} is not an IP address ({e}); use IP=10.244.0.9[,fd00::9]"),
                    )
                })
            })
            .collect()
    }
}

/// The validated environment of one invocation.
#[derive(Debug, Clone)]
pub struct Env {
    /// The command.
    pub command: Command,
    /// `CNI_CONTAINERID` (required for ADD, DEL, CHECK).
    pub container_id: Option<String>,
    /// `CNI_NETNS` (required for ADD and CHECK; optional for DEL).
    pub netns: Option<PathBuf>,
    /// `CNI_IFNAME` (required for ADD, DEL, CHECK).
    pub ifname: Option<String>,
    /// `CNI_ARGS`.
    pub args: CniArgs,
}

impl Env {
    /// Reads the process environment.
    pub fn from_process() -> Result<Self, EnvError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Reads the environment through `lookup` (tests pass a map).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, EnvError> {
        let get = |k: &str| lookup(k).filter(|v| !v.is_empty());
        let raw_command = get("CNI_COMMAND").ok_or(EnvError::Missing {
            var: "CNI_COMMAND",
            command: "any command",
        })?;
        let command = Command::parse(&raw_command).ok_or_else(|| {
            invalid(
                "CNI_COMMAND",
                &raw_command,
                "weir-cni knows ADD, DEL, CHECK, VERSION, GC and STATUS".to_owned(),
            )
        })?;
        let name = command_name(command);
        let needs_attachment = matches!(command, Command::Add | Command::Del | Command::Check);
        let needs_netns = matches!(command, Command::Add | Command::Check);

        let container_id = get("CNI_CONTAINERID");
        if let Some(id) = &container_id {
            validate_container_id(id)?;
        } else if needs_attachment {
            return Err(EnvError::Missing {
                var: "CNI_CONTAINERID",
                command: name,
            });
        }
        let ifname = get("CNI_IFNAME");
        if let Some(ifname) = &ifname {
            validate_ifname(ifname)?;
        } else if needs_attachment {
            return Err(EnvError::Missing {
                var: "CNI_IFNAME",
                command: name,
            });
        }
        let netns = get("CNI_NETNS").map(PathBuf::from);
        match &netns {
            Some(path) if !path.is_absolute() => {
                return Err(invalid(
                    "CNI_NETNS",
                    &path.display().to_string(),
                    "must be an absolute path such as /run/netns/NAME or /proc/PID/ns/net"
                        .to_owned(),
                ));
            }
            None if needs_netns => {
                return Err(EnvError::Missing {
                    var: "CNI_NETNS",
                    command: name,
                });
            }
            _ => {}
        }
        let args = match get("CNI_ARGS") {
            Some(raw) => CniArgs::parse(&raw)?,
            None => CniArgs::default(),
        };
        Ok(Self {
            command,
            container_id,
            netns,
            ifname,
            args,
        })
    }

    /// The container id (validated present for ADD, DEL and CHECK).
    #[must_use]
    pub fn container_id(&self) -> &str {
        self.container_id.as_deref().unwrap_or_default()
    }

    /// The interface name (validated present for ADD, DEL and CHECK).
    #[must_use]
    pub fn ifname(&self) -> &str {
        self.ifname.as_deref().unwrap_or_default()
    }
}

const fn command_name(command: Command) -> &'static str {
    match command {
        Command::Add => "ADD",
        Command::Del => "DEL",
        Command::Check => "CHECK",
        Command::Version => "VERSION",
        Command::Gc => "GC",
        Command::Status => "STATUS",
    }
}

fn invalid(var: &'static str, value: &str, reason: String) -> EnvError {
    EnvError::Invalid {
        var,
        value: value.to_owned(),
        reason,
    }
}

/// The spec: an alphanumeric first character, then alphanumerics, `_`, `.` and `-`.
fn validate_container_id(id: &str) -> Result<(), EnvError> {
    let mut chars = id.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if first_ok && rest_ok {
        Ok(())
    } else {
        Err(invalid(
            "CNI_CONTAINERID",
            id,
            "must start with a letter or digit and contain only letters, digits, '_', '.' and '-'"
                .to_owned(),
        ))
    }
}

/// The spec (libcni's `ValidateInterfaceName`): 1 to 15 bytes, not `.` or `..`, no `/`, `:` or
/// whitespace.
pub fn validate_ifname(ifname: &str) -> Result<(), EnvError> {
    let reason = if ifname.len() > 15 {
        Some("is longer than 15 bytes")
    } else if ifname == "." || ifname == ".." {
        Some("cannot be '.' or '..'")
    } else if ifname
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace() || c == '\0')
    {
        Some("contains '/', ':', a NUL or whitespace")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(invalid(
            "CNI_IFNAME",
            ifname,
            format!("an interface name {reason}; use a name such as eth0"),
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Result<Env, EnvError> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Env::from_lookup(|k| map.get(k).cloned())
    }

    const ADD: &[(&str, &str)] = &[
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "abc-1"),
        ("CNI_NETNS", "/run/netns/x"),
        ("CNI_IFNAME", "eth0"),
    ];

    #[test]
    fn a_complete_add_environment_parses() {
        let e = env(ADD).expect("valid");
        assert_eq!(e.command, Command::Add);
        assert_eq!(e.container_id(), "abc-1");
        assert_eq!(e.ifname(), "eth0");
    }

    #[test]
    fn missing_variables_are_named() {
        for missing in ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_COMMAND"] {
            let pairs: Vec<_> = ADD.iter().copied().filter(|(k, _)| *k != missing).collect();
            let err = env(&pairs).expect_err(missing);
            assert!(err.to_string().contains(missing), "{err}");
            assert_eq!(err.code(), Code::InvalidEnvironment);
        }
    }

    #[test]
    fn del_needs_no_netns() {
        let e = env(&[
            ("CNI_COMMAND", "DEL"),
            ("CNI_CONTAINERID", "abc"),
            ("CNI_IFNAME", "eth0"),
        ])
        .expect("valid");
        assert!(e.netns.is_none());
    }

    #[test]
    fn bad_values_are_refused() {
        for (k, v) in [
            ("CNI_COMMAND", "BOGUS"),
            ("CNI_CONTAINERID", "-abc"),
            ("CNI_CONTAINERID", "a/b"),
            ("CNI_IFNAME", "a-name-far-too-long"),
            ("CNI_IFNAME", "eth/0"),
            ("CNI_IFNAME", ".."),
            ("CNI_IFNAME", "et h0"),
            ("CNI_NETNS", "relative/path"),
            ("CNI_ARGS", "novalue"),
            ("CNI_ARGS", "=x"),
        ] {
            let pairs: Vec<_> = ADD
                .iter()
                .copied()
                .filter(|(key, _)| *key != k)
                .chain([(k, v)])
                .collect();
            let err = env(&pairs).expect_err(v);
            assert!(err.to_string().contains(k), "{err}");
        }
    }

    #[test]
    fn cni_args_give_pod_and_requested_ips() {
        let args = CniArgs::parse(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;IP=10.0.0.5,fd00::5/128",
        )
        .expect("valid");
        assert_eq!(args.pod_namespace(), Some("default"));
        assert_eq!(args.pod_name(), Some("web-0"));
        assert_eq!(
            args.ips().expect("ips"),
            vec![
                "10.0.0.5".parse::<IpAddr>().expect("ip"),
                "fd00::5".parse().expect("ip")
            ]
        );
        assert!(CniArgs::parse("IP=nope").expect("parses").ips().is_err());
    }
}
