//! DEL: idempotent. The agent removes the endpoint and releases its handle; the primary handle
//! and the workload handle `<namespace>.<pod>` are released too (an ADD may have failed between
//! allocation and endpoint); the link pins and the host veth go (the pod end goes with it).
//! Works with the netns gone, without `CNI_NETNS` and without prevResult. With the agent
//! unreachable it fails with code 11, never reporting success while addresses may be held.

use super::{CommandError, host_netlink};
use crate::{agent::AgentClient, attach, config::Config, env::Env, names};

pub(super) async fn del(
    env: &Env,
    config: &Config,
    client: &AgentClient,
) -> Result<(), CommandError> {
    let container_id = env.container_id();
    let ifname = env.ifname();
    let host_ifname = names::host_veth(container_id, ifname);
    let handle = config.handle(container_id);

    let mut pin_root = None;
    let agent_outcome = async {
        let deleted = client.delete_endpoint(container_id, ifname).await?;
        pin_root = deleted.agent_pin_root().map(std::path::Path::to_owned);
        let released = client.release_handle(&handle).await?;
        tracing::info!(
            endpoint = deleted.deleted,
            released = ?deleted.released.iter().chain(&released.released).collect::<Vec<_>>(),
            not_allocated = ?released.not_allocated,
            "endpoint removed and addresses released"
        );
        if let (Some(namespace), Some(pod)) = (env.args.pod_namespace(), env.args.pod_name()) {
            let workload = names::workload_handle(namespace, pod);
            let released = client.release_handle(&workload).await?;
            if !released.released.is_empty() {
                tracing::info!(handle = %workload, released = ?released.released, "released the workload handle");
            }
        }
        Ok::<(), CommandError>(())
    }
    .await;

    // The local part runs whatever the agent said: the pod loses its network either way. The
    // link pins are under the agent's pin root when it answered (else the configured one).
    let mut config = config.clone();
    config.adopt_agent_pin_root(pin_root.as_deref())?;
    attach::detach_endpoint_programs(&config.bpf_root, &host_ifname)?;
    let host_nl = host_netlink()?;
    if let Some(link) = host_nl.link(&host_ifname).await? {
        host_nl.delete_link(link.index, &host_ifname).await?;
        tracing::info!(host_ifname, "host veth removed");
    }
    agent_outcome
}
