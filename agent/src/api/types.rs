//! Request and response bodies of the agent API: the contract crate `weir-api` (shared with the
//! CLI and weir-cni), and the conversions that build its status parts from the agent's state.

pub use weir_api::{
    AllocateResponse, DeleteResponse, EndpointRequest, EndpointView, ReleaseRequest,
    ReleaseResponse, Status, StatusDetail, code::NOT_THIS_DATASTORE,
};

use crate::{
    config::SocketLbScope,
    dataplane::{
        attachments::AttachStats, conntrack::CtStats, map_driver::DriverStats,
        plane::DataplaneStats,
    },
};

/// `POST /v1/ipam/ops` body: a `weir ipam` operation for the agent to run on its datastore.
pub type IpamOpsRequest = weir_api::IpamOpsRequest<ipam::ops::Operation>;

/// The sweeps' counters as the status shows them (the sweep's own bookkeeping stays behind).
#[must_use]
pub fn conntrack_status(s: &CtStats) -> weir_api::ConntrackStats {
    weir_api::ConntrackStats {
        sweeps: s.sweeps,
        expired4: s.expired4,
        expired6: s.expired6,
        entries4: s.entries4,
        entries6: s.entries6,
        max4: s.max4,
        max6: s.max6,
        created4: s.created4,
        created6: s.created6,
        evicted4: s.evicted4,
        evicted6: s.evicted6,
        service_flows4: s.service_flows4,
        service_flows_max4: s.service_flows_max4,
        service_flows_expired4: s.service_flows_expired4,
    }
}

/// Every driver's counters as the status shows them.
#[must_use]
pub fn dataplane_status(s: &DataplaneStats) -> weir_api::DataplaneStatus {
    weir_api::DataplaneStatus {
        attachments: attach_counters(s.attachments),
        maps: s
            .maps
            .iter()
            .map(|(name, d)| (name.clone(), driver_counters(*d)))
            .collect(),
        repairs: s.repairs.clone(),
    }
}

fn attach_counters(s: AttachStats) -> weir_api::AttachCounters {
    weir_api::AttachCounters {
        attaches: s.attaches,
        errors: s.errors,
        unpins: s.unpins,
        updates: s.updates,
    }
}

fn driver_counters(s: DriverStats) -> weir_api::DriverCounters {
    weir_api::DriverCounters {
        deletes: s.deletes,
        errors: s.errors,
        resyncs: s.resyncs,
        writes: s.writes,
    }
}

/// `--socket-lb-scope` as the status shows it.
#[must_use]
pub fn socket_lb_scope(s: SocketLbScope) -> weir_api::SocketLbScope {
    match s {
        SocketLbScope::All => weir_api::SocketLbScope::All,
        SocketLbScope::Host => weir_api::SocketLbScope::Host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_counters_write_what_the_agent_types_wrote() {
        let stats = DataplaneStats {
            attachments: AttachStats {
                attaches: 1,
                updates: 2,
                unpins: 3,
                errors: 4,
                repairs: 0,
            },
            maps: vec![(
                "policy_v1".into(),
                DriverStats {
                    writes: 5,
                    deletes: 6,
                    errors: 7,
                    resyncs: 8,
                    repairs: 9,
                },
            )],
            repairs: vec![("policy_v1".into(), 9)],
        };
        // The status once carried these as `serde_json::to_value(&stats)`.
        let before = serde_json::to_value(&stats).expect("json");
        assert_eq!(
            serde_json::to_string(&dataplane_status(&stats)).expect("json"),
            serde_json::to_string(&before).expect("json")
        );
        let ct = CtStats {
            sweeps: 1,
            entries4: 2,
            created6: 3,
            service_flows_expired4: 4,
            baseline: Some([1, 2, 3, 4]),
            flushed_since_sweep: [5, 6],
            ..CtStats::default()
        };
        assert_eq!(
            serde_json::to_string(&conntrack_status(&ct)).expect("json"),
            serde_json::to_string(&ct).expect("json")
        );
        for scope in [SocketLbScope::All, SocketLbScope::Host] {
            assert_eq!(
                serde_json::to_value(socket_lb_scope(scope)).expect("json"),
                serde_json::to_value(scope).expect("json")
            );
        }
    }
}
