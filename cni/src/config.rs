//! The request configuration on stdin: the network's plugin object as the runtime hands it over
//! (`cniVersion`, `name`, `type`, weir's keys, `runtimeConfig`, `args`, `prevResult`), parsed and
//! validated into [`Config`]. Secrets are never logged: [`redacted`] masks them.

use std::{collections::BTreeMap, net::IpAddr, path::PathBuf, time::Duration};

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::error::{CniCode, Code};

/// The CNI versions weir-cni speaks, oldest first.
pub const SUPPORTED_VERSIONS: &[&str] = &["1.0.0", "1.1.0"];
/// The newest of them (used for errors before the request's version is known).
pub const NEWEST_VERSION: &str = "1.1.0";
/// The agent's API socket.
pub const DEFAULT_AGENT_SOCKET: &str = weir_api::DEFAULT_SOCKET;
/// The agent's pin root.
pub const DEFAULT_BPF_ROOT: &str = "/sys/fs/bpf/weir";
/// The pod interface's MTU.
pub const DEFAULT_MTU: u32 = 1500;
/// The plugin's log file.
pub const DEFAULT_LOG_FILE: &str = "/var/log/weir/cni.log";
/// How long one agent request may take (allocation waits for the agent's per-host lock).
pub const DEFAULT_AGENT_TIMEOUT_SECS: u64 = 60;

/// Configuration errors.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// stdin is not JSON.
    #[error("the network configuration on stdin is not valid JSON: {0}; check the conflist")]
    Decode(#[source] serde_json::Error),
    /// The version is not one weir-cni speaks.
    #[error(
        "cniVersion {0:?} is not supported: weir-cni speaks CNI 1.0.0 and 1.1.0; set \"cniVersion\": \"1.0.0\" or \"1.1.0\" in the conflist"
    )]
    Version(String),
    /// A field has the wrong shape or is missing.
    #[error("the network configuration is invalid: {0}; check the conflist against docs/cni.md")]
    Shape(#[source] serde_json::Error),
    /// A field has a value weir-cni cannot use.
    #[error("the network configuration is invalid: {field} {reason}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// What is wrong and what to use.
        reason: String,
    },
    /// `bpfRoot` names another pin root than the agent's (code 101, as every "the agent's
    /// programs cannot be attached from here" failure).
    #[error(
        "bpfRoot {configured} disagrees with the pin root of the agent at {socket} ({agent}); remove bpfRoot from the conflist (weir-cni takes the agent's) or set it to {agent}"
    )]
    PinRootMismatch {
        /// The conflist's `bpfRoot`.
        configured: PathBuf,
        /// The agent's socket.
        socket: PathBuf,
        /// The agent's pin root.
        agent: PathBuf,
    },
    /// A field weir-cni does not support.
    #[error("{key}={value} is not supported: {hint}")]
    Unsupported {
        /// The key.
        key: String,
        /// Its value.
        value: String,
        /// What to do instead.
        hint: &'static str,
    },
}

impl CniCode for ConfigError {
    fn code(&self) -> Code {
        match self {
            Self::Decode(_) => Code::Decode,
            Self::Version(_) => Code::IncompatibleVersion,
            Self::Shape(_) | Self::Invalid { .. } => Code::InvalidConfig,
            Self::Unsupported { .. } => Code::UnsupportedField,
            Self::PinRootMismatch { .. } => Code::Attach,
        }
    }
}

/// An IP family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// IPv4.
    Ipv4,
    /// IPv6.
    Ipv6,
}

/// The families a pod gets addresses of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Families {
    /// One IPv4 address.
    pub ipv4: bool,
    /// One IPv6 address.
    pub ipv6: bool,
}

/// One attachment the runtime still uses (GC).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attachment {
    /// `CNI_CONTAINERID` of the attachment.
    #[serde(rename = "containerID")]
    pub container_id: String,
    /// `CNI_IFNAME` of the attachment.
    pub ifname: String,
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The version the runtime selected.
    pub cni_version: String,
    /// The network name (handles are `<name>.<container id>`).
    pub name: String,
    /// The agent's API socket.
    pub agent_socket: PathBuf,
    /// The agent's pin root (programs at `progs/`, link pins at `links/`): `bpfRoot` when the
    /// conflist sets it, else the default until the agent names its own
    /// ([`Config::adopt_agent_pin_root`]).
    pub bpf_root: PathBuf,
    /// How the endpoint programs attach (`tcAttach`, written by the agent into its conflist).
    pub tc_attach: ::attach::Mechanism,
    /// Whether the conflist set `bpfRoot` (then it must agree with the agent's).
    pub bpf_root_set: bool,
    /// The pod interface's MTU (the host side gets the same).
    pub mtu: u32,
    /// Pools to allocate from (empty: the agent chooses).
    pub pools: Vec<String>,
    /// Families to allocate.
    pub families: Families,
    /// Addresses requested by `runtimeConfig.ips` or `args.cni.ips` (CNI_ARGS `IP=` is merged by
    /// the command).
    pub requested_ips: Vec<IpAddr>,
    /// Labels from `args.cni.labels`: no longer a label source; ADD refuses them when set
    /// (labels come from the pod's Pod object in the agent's source).
    pub labels: BTreeMap<String, String>,
    /// The previous plugin's result, or the ADD result (DEL, CHECK).
    pub prev_result: Option<Value>,
    /// DNS settings to put in the result.
    pub dns: Option<Value>,
    /// Log file.
    pub log_file: PathBuf,
    /// Log level (`error` … `trace`).
    pub log_level: String,
    /// Per-request timeout towards the agent.
    pub agent_timeout: Duration,
    /// Expiry of an unconfirmed allocation (the agent's default when unset).
    pub allocation_expiry_secs: Option<u64>,
    /// GC: the attachments to keep (`cni.dev/valid-attachments`, or `cni.dev/attachments`).
    pub valid_attachments: Option<Vec<Attachment>>,
    /// `ipMasq`: accepted for compatibility and only logged; the agent's
    /// `--masquerade-interfaces` does the masquerading (docs/masquerade.md).
    pub ip_masq: bool,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawConf {
    cni_version: String,
    name: String,
    #[serde(rename = "type")]
    plugin_type: String,
    agent_socket: Option<PathBuf>,
    bpf_root: Option<PathBuf>,
    tc_attach: Option<::attach::Mechanism>,
    mtu: Option<u32>,
    ipam: Option<Map<String, Value>>,
    args: Option<ArgsConf>,
    runtime_config: Option<RuntimeConf>,
    prev_result: Option<Value>,
    dns: Option<Value>,
    log_file: Option<PathBuf>,
    log_level: Option<String>,
    agent_timeout_secs: Option<u64>,
    allocation_expiry_secs: Option<u64>,
    ip_masq: Option<bool>,
    #[serde(rename = "cni.dev/valid-attachments")]
    valid_attachments: Option<Vec<Attachment>>,
    #[serde(rename = "cni.dev/attachments")]
    attachments: Option<Vec<Attachment>>,
}

#[derive(Debug, Default, Deserialize)]
struct ArgsConf {
    cni: Option<CniArgsConf>,
}

#[derive(Debug, Default, Deserialize)]
struct CniArgsConf {
    ips: Option<Vec<String>>,
    labels: Option<Labels>,
}

/// `args.cni.labels`: the conventions' list of `{"key", "value"}`, or a plain map.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Labels {
    List(Vec<Label>),
    Map(BTreeMap<String, String>),
}

#[derive(Debug, Deserialize)]
struct Label {
    key: String,
    value: String,
}

#[derive(Debug, Default, Deserialize)]
struct RuntimeConf {
    ips: Option<Vec<String>>,
}

/// Reads only the version (VERSION, and errors before the whole config is read).
#[must_use]
pub fn peek_version(stdin: &[u8]) -> Option<String> {
    serde_json::from_slice::<Value>(stdin)
        .ok()?
        .get("cniVersion")?
        .as_str()
        .map(str::to_owned)
}

/// True when weir-cni speaks `version`.
#[must_use]
pub fn is_supported(version: &str) -> bool {
    SUPPORTED_VERSIONS.contains(&version)
}

impl Config {
    /// Takes the pin root of the agent this plugin talks to (`agent`, as its API names it), so
    /// the pod gets that agent's programs: with no `bpfRoot` in the conflist it becomes the
    /// agent's; a `bpfRoot` that disagrees is refused (attaching another agent's programs, or
    /// stale pins, would give a pod that reaches nothing). An agent that does not say keeps the
    /// configured or default root.
    pub fn adopt_agent_pin_root(
        &mut self,
        agent: Option<&std::path::Path>,
    ) -> Result<(), ConfigError> {
        let Some(agent) = agent.filter(|a| !a.as_os_str().is_empty()) else {
            return Ok(());
        };
        if self.bpf_root_set && self.bpf_root != agent {
            return Err(ConfigError::PinRootMismatch {
                configured: self.bpf_root.clone(),
                socket: self.agent_socket.clone(),
                agent: agent.to_owned(),
            });
        }
        self.bpf_root = agent.to_owned();
        Ok(())
    }

    /// Parses and validates the configuration from stdin.
    pub fn parse(stdin: &[u8]) -> Result<Self, ConfigError> {
        let value: Value = serde_json::from_slice(stdin).map_err(ConfigError::Decode)?;
        if let Some(version) = value.get("cniVersion").and_then(Value::as_str)
            && !is_supported(version)
        {
            return Err(ConfigError::Version(version.to_owned()));
        }
        let raw: RawConf = serde_json::from_value(value).map_err(ConfigError::Shape)?;
        Self::validate(raw)
    }

    fn validate(raw: RawConf) -> Result<Self, ConfigError> {
        validate_name(&raw.name)?;
        if raw.plugin_type.is_empty() || raw.plugin_type.contains(['/', '\\']) {
            return Err(invalid(
                "type",
                format!(
                    "{:?} is not a plugin binary name; use \"weir-cni\"",
                    raw.plugin_type
                ),
            ));
        }
        let (pools, families) = parse_ipam(raw.ipam.as_ref())?;
        let mtu = raw.mtu.unwrap_or(DEFAULT_MTU);
        let min_mtu = if families.ipv6 { 1280 } else { 68 };
        if !(min_mtu..=65535).contains(&mtu) {
            return Err(invalid(
                "mtu",
                format!("{mtu} is out of range; use {min_mtu} to 65535 (1280 is IPv6's minimum)"),
            ));
        }
        let cni_args = raw.args.and_then(|a| a.cni).unwrap_or_default();
        // runtimeConfig (capability "ips") wins over args.cni.ips.
        let requested = raw
            .runtime_config
            .and_then(|r| r.ips)
            .filter(|ips| !ips.is_empty())
            .map(|ips| ("runtimeConfig.ips", ips))
            .or_else(|| cni_args.ips.map(|ips| ("args.cni.ips", ips)));
        let requested_ips = match requested {
            Some((field, ips)) => parse_ips(field, &ips)?,
            None => Vec::new(),
        };
        let labels = match cni_args.labels {
            Some(Labels::List(list)) => list.into_iter().map(|l| (l.key, l.value)).collect(),
            Some(Labels::Map(map)) => map,
            None => BTreeMap::new(),
        };
        let log_level = raw.log_level.unwrap_or_else(|| "info".to_owned());
        if !["error", "warn", "info", "debug", "trace"].contains(&log_level.as_str()) {
            return Err(invalid(
                "logLevel",
                format!("{log_level:?} is not a level; use error, warn, info, debug or trace"),
            ));
        }
        let agent_timeout_secs = raw.agent_timeout_secs.unwrap_or(DEFAULT_AGENT_TIMEOUT_SECS);
        if agent_timeout_secs == 0 {
            return Err(invalid("agentTimeoutSecs", "must be at least 1".to_owned()));
        }
        if raw.allocation_expiry_secs == Some(0) {
            return Err(invalid(
                "allocationExpirySecs",
                "must be at least 1".to_owned(),
            ));
        }
        Ok(Self {
            cni_version: raw.cni_version,
            name: raw.name,
            agent_socket: raw
                .agent_socket
                .unwrap_or_else(|| DEFAULT_AGENT_SOCKET.into()),
            bpf_root_set: raw.bpf_root.is_some(),
            bpf_root: raw.bpf_root.unwrap_or_else(|| DEFAULT_BPF_ROOT.into()),
            tc_attach: raw.tc_attach.unwrap_or_default(),
            mtu,
            pools,
            families,
            requested_ips,
            labels,
            prev_result: raw.prev_result.filter(|v| !is_empty_value(v)),
            dns: raw.dns,
            log_file: raw.log_file.unwrap_or_else(|| DEFAULT_LOG_FILE.into()),
            log_level,
            agent_timeout: Duration::from_secs(agent_timeout_secs),
            allocation_expiry_secs: raw.allocation_expiry_secs,
            valid_attachments: raw.valid_attachments.or(raw.attachments),
            ip_masq: raw.ip_masq.unwrap_or(false),
        })
    }

    /// The primary IPAM handle: `<network>.<container id>`.
    #[must_use]
    pub fn handle(&self, container_id: &str) -> String {
        format!("{}.{container_id}", self.name)
    }
}

fn is_empty_value(v: &Value) -> bool {
    v.is_null() || v.as_object().is_some_and(Map::is_empty)
}

fn invalid(field: &'static str, reason: String) -> ConfigError {
    ConfigError::Invalid { field, reason }
}

/// The spec: an alphanumeric first character, then alphanumerics, `_`, `.` and `-`.
fn validate_name(name: &str) -> Result<(), ConfigError> {
    let mut chars = name.chars();
    let ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if ok {
        Ok(())
    } else {
        Err(invalid(
            "name",
            format!(
                "{name:?} must start with a letter or digit and contain only letters, digits, '_', '.' and '-'"
            ),
        ))
    }
}

fn parse_ipam(ipam: Option<&Map<String, Value>>) -> Result<(Vec<String>, Families), ConfigError> {
    let default = Families {
        ipv4: true,
        ipv6: false,
    };
    let Some(ipam) = ipam else {
        return Ok((Vec::new(), default));
    };
    // The delegated-IPAM key first: it is the usual mistake (a host-local config pasted in).
    let keys = ipam
        .iter()
        .filter(|(k, _)| k.as_str() == "type")
        .chain(ipam.iter().filter(|(k, _)| k.as_str() != "type"));
    for (key, value) in keys {
        match key.as_str() {
            "pools" | "families" => {}
            "type" if value.as_str() == Some("weir") => {}
            _ => {
                return Err(ConfigError::Unsupported {
                    key: format!("ipam.{key}"),
                    value: value.to_string(),
                    hint: "weir-cni allocates through the weir agent: use only ipam.pools (pool names) and ipam.families ([\"ipv4\", \"ipv6\"])",
                });
            }
        }
    }
    let pools: Vec<String> = match ipam.get("pools") {
        Some(v) => serde_json::from_value(v.clone())
            .map_err(|e| invalid("ipam.pools", format!("must be a list of pool names ({e})")))?,
        None => Vec::new(),
    };
    if pools.iter().any(String::is_empty) {
        return Err(invalid("ipam.pools", "has an empty pool name".to_owned()));
    }
    let families = match ipam.get("families") {
        Some(v) => {
            let list: Vec<Family> = serde_json::from_value(v.clone()).map_err(|e| {
                invalid(
                    "ipam.families",
                    format!("must be a list of \"ipv4\" and \"ipv6\" ({e})"),
                )
            })?;
            if list.is_empty() {
                return Err(invalid(
                    "ipam.families",
                    "is empty; list \"ipv4\", \"ipv6\" or both".to_owned(),
                ));
            }
            Families {
                ipv4: list.contains(&Family::Ipv4),
                ipv6: list.contains(&Family::Ipv6),
            }
        }
        None => default,
    };
    Ok((pools, families))
}

fn parse_ips(field: &'static str, ips: &[String]) -> Result<Vec<IpAddr>, ConfigError> {
    ips.iter()
        .map(|s| {
            let addr = s.split_once('/').map_or(s.as_str(), |(a, _)| a);
            addr.parse::<IpAddr>().map_err(|e| {
                invalid(
                    field,
                    format!("has {s:?}, which is not an IP address ({e}); use \"10.244.0.9\" or \"10.244.0.9/32\""),
                )
            })
        })
        .collect()
}

/// Keys whose values are never logged.
const SECRET_MARKERS: &[&str] = &[
    "token",
    "password",
    "passwd",
    "secret",
    "key",
    "credential",
    "cert",
    "kubeconfig",
    "auth",
];

/// A copy of `value` with every secret-looking key's value replaced by `"<redacted>"`.
#[must_use]
pub fn redacted(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let lower = k.to_ascii_lowercase();
                    let secret = SECRET_MARKERS.iter().any(|m| lower.contains(m))
                        // `args.cni.labels` entries are {"key": …, "value": …}: not secrets.
                        && lower != "key";
                    let v = if secret {
                        Value::String("<redacted>".to_owned())
                    } else {
                        redacted(v)
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(redacted).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn parse(v: &Value) -> Result<Config, ConfigError> {
        Config::parse(v.to_string().as_bytes())
    }

    fn base() -> Value {
        json!({"cniVersion": "1.1.0", "name": "weir-net", "type": "weir-cni"})
    }

    fn with(key: &str, value: Value) -> Value {
        let mut v = base();
        v[key] = value;
        v
    }

    #[test]
    fn defaults_fill_a_minimal_config() {
        let c = parse(&base()).expect("valid");
        assert_eq!(c.agent_socket, PathBuf::from(DEFAULT_AGENT_SOCKET));
        assert_eq!(c.mtu, DEFAULT_MTU);
        assert!(c.families.ipv4 && !c.families.ipv6);
        assert_eq!(c.handle("abc"), "weir-net.abc");
        assert!(!c.ip_masq);
    }

    #[test]
    fn ip_masq_is_accepted_for_compatibility() {
        for (value, expected) in [(json!(true), true), (json!(false), false)] {
            let c = parse(&with("ipMasq", value)).expect("ipMasq is accepted");
            assert_eq!(c.ip_masq, expected);
        }
        assert!(
            parse(&with("ipMasq", json!("yes"))).is_err(),
            "but it is a boolean"
        );
    }

    #[test]
    fn full_config_parses() {
        let mut v = base();
        v["mtu"] = json!(1400);
        v["ipam"] = json!({"pools": ["p4", "p6"], "families": ["ipv4", "ipv6"]});
        v["args"] =
            json!({"cni": {"labels": [{"key": "app", "value": "web"}], "ips": ["10.0.0.1"]}});
        v["runtimeConfig"] = json!({"ips": ["10.0.0.2/24"]});
        v["cni.dev/attachments"] = json!([{"containerID": "a", "ifname": "eth0"}]);
        let c = parse(&v).expect("valid");
        assert_eq!(c.mtu, 1400);
        assert_eq!(c.pools, ["p4", "p6"]);
        assert!(c.families.ipv4 && c.families.ipv6);
        assert_eq!(c.labels.get("app").map(String::as_str), Some("web"));
        assert_eq!(
            c.requested_ips,
            vec!["10.0.0.2".parse::<IpAddr>().expect("ip")]
        );
        assert_eq!(c.valid_attachments.expect("set").len(), 1);
    }

    #[test]
    fn bad_configs_get_the_right_code() {
        let cases: Vec<(Vec<u8>, Code, &str)> = vec![
            (b"{not json".to_vec(), Code::Decode, "not valid JSON"),
            (
                with("cniVersion", json!("0.4.0")).to_string().into_bytes(),
                Code::IncompatibleVersion,
                "0.4.0",
            ),
            (
                json!({"cniVersion": "1.0.0", "type": "weir-cni"})
                    .to_string()
                    .into_bytes(),
                Code::InvalidConfig,
                "name",
            ),
            (
                with("name", json!("-bad")).to_string().into_bytes(),
                Code::InvalidConfig,
                "name",
            ),
            (
                with("mtu", json!(10)).to_string().into_bytes(),
                Code::InvalidConfig,
                "mtu",
            ),
            (
                with("mtu", json!("big")).to_string().into_bytes(),
                Code::InvalidConfig,
                "invalid",
            ),
            (
                with(
                    "ipam",
                    json!({"type": "host-local", "subnet": "10.0.0.0/24"}),
                )
                .to_string()
                .into_bytes(),
                Code::UnsupportedField,
                "ipam.type",
            ),
            (
                with("ipam", json!({"families": ["ipv5"]}))
                    .to_string()
                    .into_bytes(),
                Code::InvalidConfig,
                "ipam.families",
            ),
            (
                with("ipam", json!({"families": []}))
                    .to_string()
                    .into_bytes(),
                Code::InvalidConfig,
                "ipam.families",
            ),
            (
                with("ipam", json!({"pools": [""]}))
                    .to_string()
                    .into_bytes(),
                Code::InvalidConfig,
                "ipam.pools",
            ),
            (
                with("runtimeConfig", json!({"ips": ["nope"]}))
                    .to_string()
                    .into_bytes(),
                Code::InvalidConfig,
                "runtimeConfig.ips",
            ),
            (
                with("logLevel", json!("loud")).to_string().into_bytes(),
                Code::InvalidConfig,
                "logLevel",
            ),
        ];
        for (input, code, needle) in cases {
            let err = Config::parse(&input).expect_err(needle);
            assert_eq!(err.code(), code, "{err}");
            assert!(err.to_string().contains(needle), "{err} lacks {needle}");
        }
    }

    #[test]
    fn secrets_are_redacted_and_labels_kept() {
        let v = json!({"name": "n", "kubeconfigPath": "/x", "etcd": {"apiToken": "s3cret"},
                       "args": {"cni": {"labels": [{"key": "app", "value": "web"}]}}});
        let text = redacted(&v).to_string();
        assert!(!text.contains("s3cret") && !text.contains("/x"), "{text}");
        assert!(text.contains("\"app\"") && text.contains("web"), "{text}");
    }

    #[test]
    fn the_agent_pin_root_is_adopted_unless_bpf_root_disagrees() {
        let conf = |extra: Value| {
            let mut v = json!({"cniVersion": "1.0.0", "name": "n", "type": "weir-cni"});
            if let (Some(v), Some(extra)) = (v.as_object_mut(), extra.as_object()) {
                v.extend(extra.clone());
            }
            Config::parse(v.to_string().as_bytes()).expect("valid")
        };
        let agent = std::path::Path::new("/sys/fs/bpf/wt-agent");
        let mut unset = conf(json!({}));
        assert_eq!(unset.bpf_root, std::path::Path::new(DEFAULT_BPF_ROOT));
        unset.adopt_agent_pin_root(Some(agent)).expect("adopted");
        assert_eq!(unset.bpf_root, agent);
        let mut same = conf(json!({"bpfRoot": "/sys/fs/bpf/wt-agent"}));
        same.adopt_agent_pin_root(Some(agent)).expect("agrees");
        let mut other = conf(json!({"bpfRoot": "/sys/fs/bpf/weir"}));
        let err = other
            .adopt_agent_pin_root(Some(agent))
            .expect_err("disagrees");
        assert_eq!(err.code(), Code::Attach);
        let err = err.to_string();
        assert!(
            err.contains("bpfRoot") && err.contains("/sys/fs/bpf/wt-agent"),
            "{err}"
        );
        let mut old_agent = conf(json!({"bpfRoot": "/sys/fs/bpf/x"}));
        old_agent
            .adopt_agent_pin_root(None)
            .expect("an older agent says nothing");
        assert_eq!(old_agent.bpf_root, std::path::Path::new("/sys/fs/bpf/x"));
    }
}
