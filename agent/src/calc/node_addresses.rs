//! Other nodes' addresses (from the node records) carry the `remote-node` identity in the exact
//! maps, exactly one entry per address, gone with the node. A NetworkPolicy `ipBlock` matches on
//! address (Kubernetes and Calico semantics), so a node address inside any policy CIDR gets no
//! exact entry: the `ipcache` LPM gives it that CIDR's identity and the ipBlock selects it. (Cilium
//! keeps `remote-node` there unless `policy-cidr-match-mode` includes nodes; weir picks Calico's
//! behaviour, which map lookups alone give.)

use std::net::IpAddr;

use maps_schema::identity::REMOTE_NODE;

use super::{Calculation, Source};

impl Calculation {
    /// Another node's addresses (`Some`), or the node is gone (`None`). The local node's own
    /// record must not come here: its addresses are `host` (`set_node_addresses`).
    pub fn set_remote_node(&mut self, name: &str, addresses: Option<&[IpAddr]>) {
        let source = Source::RemoteNode(name.to_owned());
        let old = match addresses {
            Some(new) => self.remote_nodes.insert(name.to_owned(), new.to_vec()),
            None => self.remote_nodes.remove(name),
        };
        for ip in old.into_iter().flatten() {
            if addresses.is_none_or(|new| !new.contains(&ip)) {
                self.ident.unset(ip, &source);
            }
        }
        self.sync_remote_nodes(Some(name));
    }

    /// Other nodes' addresses by node name, as the node records give them.
    pub fn remote_node_addresses(&self) -> impl Iterator<Item = (&str, IpAddr)> {
        self.remote_nodes
            .iter()
            .flat_map(|(name, ips)| ips.iter().map(move |ip| (name.as_str(), *ip)))
    }

    /// Writes the remote-node entries of node `only` (all nodes: `None`) as the policy CIDRs in
    /// force say: an entry where no policy CIDR covers the address, none where one does.
    pub(super) fn sync_remote_nodes(&mut self, only: Option<&str>) {
        for (name, addresses) in &self.remote_nodes {
            if only.is_some_and(|o| o != name) {
                continue;
            }
            for ip in addresses {
                let source = Source::RemoteNode(name.clone());
                if self.cidrs.keys().any(|net| net.contains(*ip)) {
                    self.ident.unset(*ip, &source);
                } else {
                    self.ident.set(*ip, source, REMOTE_NODE);
                }
            }
        }
    }
}
