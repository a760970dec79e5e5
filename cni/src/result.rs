//! The CNI result (1.0.0 / 1.1.0): interfaces, ips, routes, dns. Unknown keys survive a round
//! trip, so a prevResult from another plugin passes through unchanged.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A result.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CniResult {
    /// Always the request's version.
    pub cni_version: String,
    /// Interfaces (host side without `sandbox`, pod side with it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<Interface>,
    /// Addresses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<IpConfig>,
    /// Routes in the pod.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<Route>,
    /// DNS settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<Value>,
    /// Anything else another plugin put there.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// An interface.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Interface {
    /// Name.
    pub name: String,
    /// MAC address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// MTU (CNI 1.1 only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// The netns path for pod interfaces; absent for host interfaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
    /// Anything else.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// An address.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct IpConfig {
    /// CIDR (`10.244.0.9/32`).
    pub address: String,
    /// Gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    /// Index into `interfaces`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<usize>,
    /// Anything else.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A route.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Route {
    /// Destination CIDR.
    pub dst: String,
    /// Gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<String>,
    /// Anything else (`mtu`, `scope`, … in 1.1).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl CniResult {
    /// Reads a prevResult.
    pub fn from_value(value: &Value) -> Result<Self, serde_json::Error> {
        serde_json::from_value(value.clone())
    }

    /// The result at `version`: 1.0.0 has no interface `mtu`.
    #[must_use]
    pub fn for_version(mut self, version: &str) -> Self {
        self.cni_version = version.to_owned();
        if version == "1.0.0" {
            for i in &mut self.interfaces {
                i.mtu = None;
            }
        }
        self
    }

    /// Appends `ours` to `self` (a prevResult), re-indexing `ours`' `ips[].interface`.
    #[must_use]
    pub fn chain(mut self, ours: Self) -> Self {
        let offset = self.interfaces.len();
        self.interfaces.extend(ours.interfaces);
        self.ips.extend(ours.ips.into_iter().map(|mut ip| {
            ip.interface = ip.interface.map(|i| i + offset);
            ip
        }));
        self.routes.extend(ours.routes);
        if self.dns.is_none() {
            self.dns = ours.dns;
        }
        self
    }

    /// The index of the interface called `name` with the given sandbox (`None`: a host interface).
    #[must_use]
    pub fn interface_index(&self, name: &str, sandbox: Option<&str>) -> Option<usize> {
        self.interfaces.iter().position(|i| {
            i.name == name && i.sandbox.as_deref().filter(|s| !s.is_empty()) == sandbox
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn unknown_keys_survive_a_round_trip() {
        let v = json!({"cniVersion": "1.0.0",
            "interfaces": [{"name": "eth0", "sandbox": "/run/netns/x", "socketPath": "/s"}],
            "ips": [{"address": "10.0.0.1/32", "interface": 0}],
            "routes": [{"dst": "0.0.0.0/0", "gw": "169.254.1.1"}],
            "custom": {"a": 1}});
        let r = CniResult::from_value(&v).expect("parses");
        assert_eq!(serde_json::to_value(&r).expect("serialises"), v);
    }

    #[test]
    fn chaining_reindexes_our_interfaces() {
        let prev = CniResult {
            interfaces: vec![Interface {
                name: "a".into(),
                ..Interface::default()
            }],
            ..CniResult::default()
        };
        let ours = CniResult {
            interfaces: vec![Interface {
                name: "b".into(),
                ..Interface::default()
            }],
            ips: vec![IpConfig {
                address: "10.0.0.1/32".into(),
                interface: Some(0),
                ..IpConfig::default()
            }],
            ..CniResult::default()
        };
        let chained = prev.chain(ours);
        assert_eq!(chained.ips[0].interface, Some(1));
        assert_eq!(chained.interface_index("b", None), Some(1));
    }

    #[test]
    fn version_1_0_drops_interface_mtu() {
        let r = CniResult {
            interfaces: vec![Interface {
                name: "eth0".into(),
                mtu: Some(1500),
                ..Interface::default()
            }],
            ..CniResult::default()
        };
        assert_eq!(r.clone().for_version("1.0.0").interfaces[0].mtu, None);
        assert_eq!(r.for_version("1.1.0").interfaces[0].mtu, Some(1500));
    }
}
