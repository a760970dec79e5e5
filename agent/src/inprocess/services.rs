//! Services through the real policy-directory source, the loop and the service map drivers over
//! the fake kernel: the maps hold the desired frontends, slots, backends and reverse NAT (orphans
//! of an earlier run swept), a restart over unchanged sources writes nothing, and an EndpointSlice
//! edit writes only what changed; the loop's view for `weir service list`.

use std::time::Duration;

use maps_schema::service::{Backend4, RevNat4, Svc4Key, Svc4Value};

use super::{
    converge::Agent,
    harness::{self, FakeKernel},
};
use crate::control::applier::Command;

const SERVICE: &str = "kind: Service
metadata: {name: db, namespace: prod}
spec: {clusterIP: 10.96.0.10, ports: [{name: sql, port: 80, targetPort: 8080}]}
";

fn slice(endpoints: &[(&str, bool)]) -> String {
    let eps: Vec<String> = endpoints
        .iter()
        .map(|(a, ready)| format!("- {{addresses: [{a}], conditions: {{ready: {ready}}}}}\n"))
        .collect();
    format!(
        "kind: EndpointSlice\nmetadata: {{name: db-1, namespace: prod, labels: {{kubernetes.io/service-name: db}}}}\naddressType: IPv4\nports: [{{name: sql, port: 8080}}]\nendpoints:\n{}",
        eps.concat()
    )
}

fn write(paths: &crate::paths::Paths, slice: &str) {
    std::fs::create_dir_all(&paths.policy_dir).expect("policy dir");
    let tmp = paths.policy_dir.join(".svc.yaml.tmp");
    std::fs::write(&tmp, format!("{SERVICE}---\n{slice}")).expect("write");
    std::fs::rename(&tmp, paths.policy_dir.join("svc.yaml")).expect("rename");
}

const VIP: Svc4Key = Svc4Key {
    addr: [10, 96, 0, 10],
    port: 80,
    protocol: 6,
    scope: 0,
};

fn frontend(kernel: &FakeKernel) -> Option<Svc4Value> {
    kernel
        .services
        .frontends
        .unordered()
        .into_iter()
        .find(|(k, _)| *k == VIP)
        .map(|(_, v)| v)
}

fn backend_addrs(kernel: &FakeKernel) -> Vec<[u8; 4]> {
    let mut addrs: Vec<[u8; 4]> = kernel
        .services
        .backends
        .unordered()
        .into_iter()
        .map(|(_, b)| b.addr)
        .collect();
    addrs.sort_unstable();
    addrs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_maps_follow_the_slices_sweep_orphans_and_a_restart_writes_nothing() {
    let dir = tempfile::tempdir().expect("tmp");
    let paths = harness::paths(dir.path());
    write(
        &paths,
        &slice(&[
            ("10.244.0.11", true),
            ("10.244.0.12", true),
            ("10.244.0.13", false),
        ]),
    );
    let kernel = FakeKernel::new();
    // An earlier run's frontend and backend that no source names any more.
    let stale = Svc4Key {
        addr: [10, 96, 9, 9],
        ..VIP
    };
    kernel
        .services
        .frontends
        .preload(&[(stale, Svc4Value::default())]);
    kernel
        .services
        .backends
        .preload(&[(77, Backend4::default())]);

    let agent = Agent::start(&paths, &kernel);
    agent.ready().await;
    let f = frontend(&kernel).expect("the frontend is written");
    assert_eq!(f.backend_count, 2, "ready endpoints only");
    assert_eq!(
        backend_addrs(&kernel),
        vec![[10, 244, 0, 11], [10, 244, 0, 12]]
    );
    assert!(
        kernel
            .services
            .backends
            .unordered()
            .iter()
            .all(|(_, b)| b.port == 8080),
        "the slice's port"
    );
    assert_eq!(kernel.services.slots.unordered().len(), 2);
    assert_eq!(
        kernel.services.revnat.unordered(),
        vec![(
            f.service_id,
            RevNat4 {
                addr: VIP.addr,
                port: 80,
                pad: 0
            }
        )]
    );
    assert_eq!(
        kernel.services.frontends.unordered().len(),
        1,
        "the orphan frontend is swept"
    );
    agent.stop();

    // A restart over unchanged sources writes nothing.
    let writes = kernel.services.mutations();
    let agent = Agent::start(&paths, &kernel);
    agent.ready().await;
    assert_eq!(
        kernel.services.mutations(),
        writes,
        "a restart writes no service entry"
    );

    // One backend leaves the slice (the directory read again and sent as the source does; a
    // spawned source could take its first fingerprint after the edit): the count shrinks, its
    // slot and backend entries go, and the other backend's entries are not rewritten.
    write(&paths, &slice(&[("10.244.0.12", true)]));
    let (set, errors) = crate::calc::policy::load::load_dir(&paths.policy_dir);
    agent
        .handle
        .send(Command::Policies { set, errors })
        .expect("sent");
    agent
        .wait_until("the frontend follows the slice", || {
            frontend(&kernel).is_some_and(|f| f.backend_count == 1)
        })
        .await;
    agent
        .wait_until("the left backend is deleted", || {
            backend_addrs(&kernel) == vec![[10, 244, 0, 12]]
                && kernel.services.slots.unordered().len() == 1
        })
        .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Frontend count, slot 0 (now the other backend), slot 1 and the backend deleted; the kept
    // backend's member entry names slot 0, the left one's is deleted.
    assert_eq!(
        kernel.services.mutations() - writes,
        6,
        "only what changed is written"
    );
    let members = kernel.services.members.unordered();
    assert_eq!(members.len(), 1, "one member: {members:?}");
    assert_eq!(
        members[0].1.slot, 0,
        "the kept backend in slot 0: {members:?}"
    );
    agent.stop();
}
