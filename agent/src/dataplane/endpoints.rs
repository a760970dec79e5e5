//! The endpoints manager: turns registered endpoints, their links and identities into
//! `endpoints_v1` entries (ifindex → `EndpointInfo`). Cheap, no kernel I/O: it only updates the
//! map driver's desired state.

use std::{collections::BTreeMap, net::IpAddr};

use maps_schema::EndpointInfo;

use super::map_driver::MapDriver;
use weir_api::Endpoint;

/// The map entry of an endpoint.
#[must_use]
pub fn entry(endpoint: &Endpoint, identity: u32, flags: u32) -> EndpointInfo {
    entry_of(endpoint.id, &endpoint.ips, identity, flags)
}

/// [`entry`] from the endpoint's id and addresses alone.
#[must_use]
pub fn entry_of(endpoint_id: u32, ips: &[IpAddr], identity: u32, flags: u32) -> EndpointInfo {
    let mut info = EndpointInfo {
        endpoint_id,
        identity,
        flags,
        ..EndpointInfo::default()
    };
    let (mut v4, mut v6) = (0, 0);
    for ip in ips {
        match ip {
            IpAddr::V4(a) if v4 < info.ipv4.len() => {
                info.ipv4[v4] = a.octets();
                v4 += 1;
            }
            IpAddr::V6(a) if v6 < info.ipv6.len() => {
                info.ipv6[v6] = a.octets();
                v6 += 1;
            }
            _ => {}
        }
    }
    info
}

/// Desired `endpoints_v1` contents from the registry and the known links.
pub struct EndpointsManager {
    /// host ifname → ifindex of workload links.
    links: BTreeMap<String, u32>,
    /// host ifname → (endpoint entry) for registered endpoints.
    entries: BTreeMap<String, EndpointInfo>,
}

impl EndpointsManager {
    /// Empty.
    #[must_use]
    pub fn new() -> Self {
        Self {
            links: BTreeMap::new(),
            entries: BTreeMap::new(),
        }
    }

    /// A workload link appeared (or changed index).
    pub fn link_up(
        &mut self,
        driver: &mut MapDriver<u32, EndpointInfo>,
        ifname: &str,
        ifindex: u32,
    ) {
        if let Some(old) = self.links.insert(ifname.to_owned(), ifindex)
            && old != ifindex
        {
            driver.remove(&old);
        }
        if let Some(info) = self.entries.get(ifname) {
            driver.set(ifindex, *info);
        }
    }

    /// A workload link went away.
    pub fn link_gone(&mut self, driver: &mut MapDriver<u32, EndpointInfo>, ifname: &str) {
        if let Some(ifindex) = self.links.remove(ifname) {
            driver.remove(&ifindex);
        }
    }

    /// An endpoint was registered or changed.
    pub fn upsert(
        &mut self,
        driver: &mut MapDriver<u32, EndpointInfo>,
        host_ifname: &str,
        info: EndpointInfo,
    ) {
        self.entries.insert(host_ifname.to_owned(), info);
        if let Some(ifindex) = self.links.get(host_ifname) {
            driver.set(*ifindex, info);
        }
    }

    /// An endpoint was removed.
    pub fn remove(&mut self, driver: &mut MapDriver<u32, EndpointInfo>, host_ifname: &str) {
        self.entries.remove(host_ifname);
        if let Some(ifindex) = self.links.get(host_ifname) {
            driver.remove(ifindex);
        }
    }

    /// The ifindex of a workload link, if it exists.
    #[must_use]
    pub fn ifindex(&self, ifname: &str) -> Option<u32> {
        self.links.get(ifname).copied()
    }

    /// The entry of an endpoint whose map entry is desired.
    #[must_use]
    pub fn entry_of(&self, host_ifname: &str) -> Option<&EndpointInfo> {
        self.entries.get(host_ifname)
    }
}

impl Default for EndpointsManager {
    fn default() -> Self {
        Self::new()
    }
}
