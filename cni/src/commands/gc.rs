//! GC (CNI 1.1): every endpoint of this network (handle `<network>.…`) whose attachment is not in
//! `cni.dev/valid-attachments` is removed with its addresses, link pins and host veth. Keeps going
//! after a failure and reports them all.

use super::{CommandError, host_netlink};
use crate::{
    agent::AgentClient,
    attach,
    config::Config,
    error::{CniCode, Code},
    names,
};

pub(super) async fn gc(config: &Config, client: &AgentClient) -> Result<(), CommandError> {
    let valid = config
        .valid_attachments
        .as_ref()
        .ok_or(CommandError::NoValidAttachments)?;
    let config = &super::with_agent_pin_root(config, client).await?;
    let prefix = format!("{}.", config.name);
    let endpoints = client.list_endpoints().await?;
    let host_nl = host_netlink()?;
    let mut failures = Vec::new();
    let mut code = None;
    for ep in endpoints.into_iter().map(|view| view.endpoint) {
        let keep = !ep.handle.starts_with(&prefix)
            || valid
                .iter()
                .any(|a| a.container_id == ep.container_id && a.ifname == ep.ifname);
        // Never touch a link that is not a workload veth, whatever the agent says.
        if keep || !ep.host_ifname.starts_with(names::HOST_VETH_PREFIX) {
            continue;
        }
        tracing::info!(container_id = %ep.container_id, ifname = %ep.ifname, "GC: releasing a stale attachment");
        let mut fail = |what: String, c: Code| {
            failures.push(format!("{}:{}: {what}", ep.container_id, ep.ifname));
            code.get_or_insert(c);
        };
        match client.delete_endpoint(&ep.container_id, &ep.ifname).await {
            Ok(_) => {
                if let Err(e) = client.release_handle(&ep.handle).await {
                    fail(e.to_string(), e.code());
                }
            }
            Err(e) => fail(e.to_string(), e.code()),
        }
        if let Err(e) = attach::detach_endpoint_programs(&config.bpf_root, &ep.host_ifname) {
            fail(e.to_string(), e.code());
        }
        match host_nl.link(&ep.host_ifname).await {
            Ok(Some(link)) => {
                if let Err(e) = host_nl.delete_link(link.index, &ep.host_ifname).await {
                    fail(e.to_string(), e.code());
                }
            }
            Ok(None) => {}
            Err(e) => fail(e.to_string(), e.code()),
        }
    }
    match code {
        None => Ok(()),
        Some(code) => Err(CommandError::Gc { code, failures }),
    }
}
