//! The upstream NetworkPolicy e2e topology on one real agent: namespaces x, y and z with pods a,
//! b and c in each (nine pod network namespaces behind workload veths of a node namespace), each
//! serving TCP and UDP on 80 and 81 and SCTP on 80; and two hosts outside the cluster
//! (198.51.100.10 and 198.51.100.200, one namespace each behind a plain `wt…` veth) serving the
//! same, for `ipBlock` peers. A case writes its policies, namespaces and pods to the agent's
//! `--policy-dir` ([`ObjectSource::PolicyDir`]) or serves them from the test API server to an
//! agent on `--source kubernetes` ([`ObjectSource::ApiServer`]: only the objects that changed
//! are written, so each case reaches the agent as watch events), and the whole matrix — every source × destination × port × protocol, self-pairs left out as upstream
//! does — is probed in parallel with real packets until it equals what [`Model`] computes
//! (bounded). Each case's expectation must differ from the one before it, so a pass proves the
//! new policies took effect.

use std::{
    cell::RefCell,
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, SocketAddrV4},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use hyper::Method;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde_json::{Value, json};

use crate::{
    agent_pod::allocate_ipv4,
    agent_proc::{AgentDirs, AgentProcess},
    bpf::PinRoot,
    kube_api::KubeApi,
    names,
    netns::NetNs,
    netpol::{Labels, Model, ModelPod, Proto, Source, Target, labels},
    netpol_cases::Case,
    netpol_probe::{Probe, Servers, probe},
    pod::{GATEWAY, workload_name},
};

/// The namespaces.
pub const NAMESPACES: [&str; 3] = ["x", "y", "z"];
/// The pods of each namespace.
pub const PODS: [&str; 3] = ["a", "b", "c"];
/// The ports probed, by protocol.
pub const PORTS: [(Proto, u16); 5] = [
    (Proto::Tcp, 80),
    (Proto::Tcp, 81),
    (Proto::Udp, 80),
    (Proto::Udp, 81),
    (Proto::Sctp, 80),
];
/// The hosts outside the cluster: one inside 198.51.100.128/25, one outside it.
pub const EXTERNALS: [Ipv4Addr; 2] = [
    Ipv4Addr::new(198, 51, 100, 10),
    Ipv4Addr::new(198, 51, 100, 200),
];
/// The container port names every pod declares, as upstream's `serve-80-tcp` etc.
pub const NAMED_PORTS: [(&str, Proto, u16); 5] = [
    ("serve-80-tcp", Proto::Tcp, 80),
    ("serve-81-tcp", Proto::Tcp, 81),
    ("serve-80-udp", Proto::Udp, 80),
    ("serve-81-udp", Proto::Udp, 81),
    ("serve-80-sctp", Proto::Sctp, 80),
];
/// How long a case may take to show its expected matrix.
const CONVERGE: Duration = Duration::from_secs(20);

/// How pods get their labels: the one place to switch when labels move to `kind: Pod` documents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LabelSource {
    /// `labels` in the endpoint registration (`PUT /v1/endpoints/…`), as the API pods of the
    /// agent tests have them.
    Registration,
    /// `kind: Pod` documents in the policy directory (labels and named container ports), as the
    /// standalone source defines pods; the registration carries none.
    PodDocument,
}

/// Where the agent reads the cluster's objects (policies, namespaces, pods) from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectSource {
    /// YAML documents in its `--policy-dir` (the standalone source).
    PolicyDir,
    /// The test API server (`tests::kube_api`), with the agent on `--source kubernetes`.
    ApiServer,
}

/// The label source this suite uses.
pub const LABEL_SOURCE: LabelSource = LabelSource::PodDocument;

/// One probe of the matrix and what the model needs to judge it.
struct Cell<'a> {
    /// `x/a -> y/b TCP/80`.
    label: String,
    src: Source<'a>,
    dst: Target<'a>,
    proto: Proto,
    port: u16,
    /// The index of the source namespace (pods first, then the outside hosts).
    source: usize,
    /// The destination address.
    addr: Ipv4Addr,
}

/// A pod of the topology (its namespace and veth go away on drop, its servers first).
struct LabPod {
    model: ModelPod,
    /// Its name in its namespace (`a`), workload link and IPAM handle: what a re-registration
    /// sends again.
    name: String,
    host: String,
    handle: String,
    ip: Ipv4Addr,
    _servers: Servers,
    ns: NetNs,
}

/// A host outside the cluster.
struct External {
    ip: Ipv4Addr,
    _servers: Servers,
    ns: NetNs,
}

/// The lab: an agent in a node namespace, nine pods and two outside hosts.
pub struct Lab {
    pods: Vec<LabPod>,
    externals: Vec<External>,
    agent: AgentProcess,
    /// The API server of [`ObjectSource::ApiServer`] (stopped after the agent).
    api: Option<KubeApi>,
    /// What the API server was last given, by (kind, namespace, name): only changes are applied.
    served: RefCell<BTreeMap<(String, String, String), Value>>,
    dirs: AgentDirs,
    _node: NetNs,
    _root: PinRoot,
    /// The expectation of the case before (a case must change it).
    previous: Option<BTreeMap<String, bool>>,
    /// Namespace labels in force.
    namespaces: BTreeMap<String, Labels>,
    /// Cases run.
    pub cases: usize,
}

/// The labels pods carry: `pod: <name>`, as upstream's.
fn pod_labels(pod: &str) -> Labels {
    labels(&[("pod", pod)])
}

/// The namespace labels: `ns: <name>` and the one the API server sets on every namespace.
#[must_use]
pub fn namespace_labels(ns: &str) -> Labels {
    labels(&[("ns", ns), ("kubernetes.io/metadata.name", ns)])
}

/// SCTP source ports, distinct across every probe of the process.
static SCTP_PORT: AtomicU32 = AtomicU32::new(0);

fn next_sctp_port() -> u16 {
    let n = SCTP_PORT.fetch_add(1, Ordering::Relaxed);
    u16::try_from(20_000 + n % 40_000).expect("in range")
}

/// Plumbs `ns` behind a new veth of `node` named `host`: its address `ip`/32, a default route via
/// the link-local gateway the node side owns, and the node's host route back.
fn plumb(node: &NetNs, ns: &NetNs, host: &str, ip: Ipv4Addr) {
    node.exec(&[
        "ip",
        "link",
        "add",
        host,
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "netns",
        ns.name(),
    ]);
    node.exec(&["ip", "link", "set", host, "up"]);
    ns.exec(&["ip", "link", "set", "eth0", "up"]);
    node.exec(&["ip", "addr", "add", &format!("{GATEWAY}/32"), "dev", host]);
    node.exec(&["ip", "route", "add", &format!("{ip}/32"), "dev", host]);
    ns.exec(&["ip", "addr", "add", &format!("{ip}/32"), "dev", "eth0"]);
    ns.exec(&["ip", "route", "add", GATEWAY, "dev", "eth0"]);
    ns.exec(&[
        "ip", "route", "add", "default", "via", GATEWAY, "dev", "eth0",
    ]);
}

impl Lab {
    /// Starts the agent on its policy directory and the topology, and checks the no-policy
    /// baseline (every probe passes: the positive control of every case after it).
    #[must_use]
    pub fn new() -> Self {
        Self::with_source(ObjectSource::PolicyDir)
    }

    /// [`Lab::new`] with the objects read from `source`.
    #[must_use]
    pub fn with_source(source: ObjectSource) -> Self {
        let root = PinRoot::new();
        let dirs = AgentDirs::new();
        std::fs::create_dir_all(dirs.path("policies")).expect("policy dir");
        let node = NetNs::new();
        node.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
        let api = (source == ObjectSource::ApiServer).then(|| KubeApi::start(Some(&node)));
        let kubeconfig = api.as_ref().map(|a| a.kubeconfig().display().to_string());
        let args: Vec<&str> = match &kubeconfig {
            Some(k) => vec!["--source", "kubernetes", "--kubeconfig", k],
            None => Vec::new(),
        };
        let agent = AgentProcess::start(&root, &dirs, Some(&node), &args);
        let tcp_udp: Vec<u16> = vec![80, 81];
        let sctp: Vec<u16> = vec![80];
        let mut pods = Vec::new();
        let mut served = BTreeMap::new();
        for ns_name in NAMESPACES {
            for pod_name in PODS {
                let ns = NetNs::new();
                let host = workload_name();
                let handle = format!("wt-netpol.{ns_name}.{pod_name}");
                let ip: Ipv4Addr = allocate_ipv4(&agent, &handle)
                    .parse()
                    .expect("an IPv4 address");
                plumb(&node, &ns, &host, ip);
                let model = ModelPod {
                    namespace: ns_name.to_owned(),
                    labels: pod_labels(pod_name),
                };
                let servers = Servers::start(&ns, &tcp_udp, &sctp);
                let pod = LabPod {
                    model,
                    name: pod_name.to_owned(),
                    host,
                    handle,
                    ip,
                    _servers: servers,
                    ns,
                };
                // On the Kubernetes source the agent registers a pod only once the watch has
                // delivered its Pod (as kubelet's pods are on the API server before their sandbox).
                if let Some(api) = &api {
                    let object = pod_object(&pod);
                    api.apply(object.clone());
                    served.insert(
                        ("Pod".to_owned(), (*ns_name).to_owned(), pod.name.clone()),
                        object,
                    );
                }
                register(
                    &agent,
                    &pod.model,
                    &pod.name,
                    &pod.host,
                    &pod.handle,
                    pod.ip,
                );
                pods.push(pod);
            }
        }
        let externals = EXTERNALS
            .iter()
            .map(|ip| {
                let ns = NetNs::new();
                plumb(&node, &ns, &names::unique("ext"), *ip);
                let servers = Servers::start(&ns, &tcp_udp, &sctp);
                External {
                    ip: *ip,
                    _servers: servers,
                    ns,
                }
            })
            .collect();
        let mut lab = Self {
            pods,
            externals,
            agent,
            api,
            served: RefCell::new(served),
            dirs,
            _node: node,
            _root: root,
            previous: None,
            namespaces: NAMESPACES
                .iter()
                .map(|ns| ((*ns).to_owned(), namespace_labels(ns)))
                .collect(),
            cases: 0,
        };
        lab.case("no policy: everything reaches everything", &[]);
        lab
    }

    /// The model of `policies` over this topology with its labels now.
    #[must_use]
    pub fn model(&self, policies: &[NetworkPolicy]) -> Model {
        Model {
            namespaces: self.namespaces.clone(),
            policies: policies.to_vec(),
            named_ports: NAMED_PORTS
                .iter()
                .map(|(name, proto, port)| ((*name).to_owned(), (*proto, *port)))
                .collect(),
        }
    }

    /// Gives pod `namespace/pod` the labels `labels` (its `pod: <name>` label stays), through the
    /// label source; the next [`Lab::case`] checks the traffic that follows.
    pub fn relabel_pod(&mut self, namespace: &str, pod: &str, extra: &[(&str, &str)]) {
        let p = self
            .pods
            .iter_mut()
            .find(|p| p.model.namespace == namespace && p.name == pod)
            .unwrap_or_else(|| panic!("no pod {namespace}/{pod}"));
        let mut new = pod_labels(pod);
        new.extend(labels(extra));
        p.model.labels = new;
        match LABEL_SOURCE {
            LabelSource::Registration => {
                register(&self.agent, &p.model, &p.name, &p.host, &p.handle, p.ip);
            }
            // Written with the next case's policies.
            LabelSource::PodDocument => {}
        }
    }

    /// Gives namespace `namespace` its standard labels plus `extra` (written with the next case's
    /// policies, as a Namespace document).
    pub fn relabel_namespace(&mut self, namespace: &str, extra: &[(&str, &str)]) {
        let mut new = namespace_labels(namespace);
        new.extend(labels(extra));
        self.namespaces.insert(namespace.to_owned(), new);
    }

    /// Runs each of `cases` in order ([`Lab::case`]).
    pub fn run(&mut self, cases: impl IntoIterator<Item = Case>) {
        for c in cases {
            self.case(c.name, &c.policies);
        }
    }

    /// Runs one case: `policies` replace the ones in force; the matrix must come to equal the
    /// model's within [`CONVERGE`].
    pub fn case(&mut self, what: &str, policies: &[NetworkPolicy]) {
        let model = self.model(policies);
        let probes = self.probes();
        let want: BTreeMap<String, bool> = probes
            .iter()
            .map(|c| {
                (
                    c.label.clone(),
                    model.allows_flow(c.src, c.dst, c.proto, c.port),
                )
            })
            .collect();
        if let Some(previous) = &self.previous {
            assert_ne!(
                previous, &want,
                "{what}: the case expects the same matrix as the one before it, so it could not \
                 show that its policies took effect; reorder the cases"
            );
        }
        self.write(&model);
        // Conntrack of the case before (flows it allowed) would pass its packets: start clean.
        let _: Value = self
            .agent
            .api(Method::DELETE, "/v1/bpf/ct", None)
            .expect("flush conntrack");
        let deadline = Instant::now() + CONVERGE;
        let mut rounds = 0;
        loop {
            rounds += 1;
            let got = self.round(&probes);
            let wrong: Vec<String> = want
                .iter()
                .filter(|(label, w)| got.get(*label) != Some(*w))
                .map(|(label, w)| format!("  {label}: want {}, got {}", verdict(*w), verdict(!*w)))
                .collect();
            if wrong.is_empty() {
                let allowed = want.values().filter(|w| **w).count();
                eprintln!(
                    "case {what:?}: {} probes ({allowed} allowed) match the model after {rounds} round(s)",
                    want.len()
                );
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: after {rounds} rounds, {} of {} probes disagree with the model:\n{}",
                wrong.len(),
                want.len(),
                wrong.join("\n")
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        self.previous = Some(want);
        self.cases += 1;
    }

    /// Puts the model's objects and the pods in force: in the policy directory, or on the API
    /// server.
    fn write(&self, model: &Model) {
        match &self.api {
            Some(api) => self.serve(api, model),
            None => self.write_files(model),
        }
    }

    /// Applies to the API server every object that changed since the last case (an ADDED or
    /// MODIFIED watch event each) and deletes the policies that went (a DELETED event each).
    fn serve(&self, api: &KubeApi, model: &Model) {
        let mut want: BTreeMap<(String, String, String), Value> = BTreeMap::new();
        for (name, labels) in &model.namespaces {
            let object = json!({"apiVersion": "v1", "kind": "Namespace",
                                "metadata": {"name": name, "labels": labels}});
            want.insert(("Namespace".into(), String::new(), name.clone()), object);
        }
        for policy in &model.policies {
            let mut object = serde_json::to_value(policy).expect("the policy serialises");
            object["apiVersion"] = "networking.k8s.io/v1".into();
            object["kind"] = "NetworkPolicy".into();
            let namespace = policy.metadata.namespace.clone().unwrap_or_default();
            let name = policy.metadata.name.clone().unwrap_or_default();
            want.insert(("NetworkPolicy".into(), namespace, name), object);
        }
        for p in &self.pods {
            let key = ("Pod".into(), p.model.namespace.clone(), p.name.clone());
            want.insert(key, pod_object(p));
        }
        let mut served = self.served.borrow_mut();
        let gone: Vec<(String, String, String)> = served
            .keys()
            .filter(|k| !want.contains_key(*k))
            .cloned()
            .collect();
        for key in gone {
            assert!(
                api.delete(&key.0, &key.1, &key.2),
                "{key:?} was on the API server"
            );
            served.remove(&key);
        }
        for (key, object) in want {
            if served.get(&key) != Some(&object) {
                api.apply(object.clone());
                served.insert(key, object);
            }
        }
    }

    /// Replaces the policy directory's contents, atomically (a rename).
    fn write_files(&self, model: &Model) {
        let file = self.dirs.path("policies").join("netpol.yaml");
        let tmp = self.dirs.path("policies").join("netpol.yaml.tmp");
        let mut text = model.manifest();
        for doc in pod_documents(&self.pods) {
            text.push_str("\n---\n");
            text.push_str(&doc);
        }
        std::fs::write(&tmp, text).expect("write the policies");
        std::fs::rename(&tmp, &file).expect("rename the policies into place");
    }

    /// Every probe of the matrix.
    fn probes(&self) -> Vec<Cell<'_>> {
        let mut out = Vec::new();
        let pod_name = |p: &LabPod| {
            format!(
                "{}/{}",
                p.model.namespace,
                p.model.labels.get("pod").map_or("?", String::as_str)
            )
        };
        // Sources 0..9 are the pods, 9.. the outside hosts.
        for (si, src) in self.pods.iter().enumerate() {
            for (di, dst) in self.pods.iter().enumerate() {
                if si == di {
                    continue;
                }
                for (proto, port) in PORTS {
                    out.push(Cell {
                        label: format!(
                            "{} -> {} {}/{port}",
                            pod_name(src),
                            pod_name(dst),
                            proto.name()
                        ),
                        src: Source::Pod(&src.model),
                        dst: Target::Pod(&dst.model),
                        proto,
                        port,
                        source: si,
                        addr: dst.ip,
                    });
                }
            }
            for ext in &self.externals {
                for (proto, port) in PORTS {
                    out.push(Cell {
                        label: format!("{} -> {} {}/{port}", pod_name(src), ext.ip, proto.name()),
                        src: Source::Pod(&src.model),
                        dst: Target::External(IpAddr::V4(ext.ip)),
                        proto,
                        port,
                        source: si,
                        addr: ext.ip,
                    });
                }
            }
        }
        for (ei, ext) in self.externals.iter().enumerate() {
            for dst in &self.pods {
                for (proto, port) in PORTS {
                    out.push(Cell {
                        label: format!("{} -> {} {}/{port}", ext.ip, pod_name(dst), proto.name()),
                        src: Source::External(IpAddr::V4(ext.ip)),
                        dst: Target::Pod(&dst.model),
                        proto,
                        port,
                        source: self.pods.len() + ei,
                        addr: dst.ip,
                    });
                }
            }
        }
        out
    }

    /// One round: every probe at once (a thread per source namespace, a thread per probe in it).
    fn round(&self, probes: &[Cell<'_>]) -> BTreeMap<String, bool> {
        let sources: Vec<&NetNs> = self
            .pods
            .iter()
            .map(|p| &p.ns)
            .chain(self.externals.iter().map(|e| &e.ns))
            .collect();
        std::thread::scope(|scope| {
            let handles: Vec<_> = sources
                .iter()
                .enumerate()
                .map(|(si, ns)| {
                    let mine: Vec<(String, Probe)> = probes
                        .iter()
                        .filter(|c| c.source == si)
                        .map(|c| {
                            (
                                c.label.clone(),
                                Probe {
                                    to: SocketAddrV4::new(c.addr, c.port),
                                    proto: c.proto,
                                    sctp_sport: next_sctp_port(),
                                },
                            )
                        })
                        .collect();
                    scope.spawn(move || {
                        // Threads spawned inside the namespace's thread start in it too.
                        ns.run(move || {
                            std::thread::scope(|inner| {
                                let hs: Vec<_> = mine
                                    .into_iter()
                                    .map(|(label, p)| inner.spawn(move || (label, probe(&p))))
                                    .collect();
                                hs.into_iter()
                                    .map(|h| h.join().expect("a probe thread"))
                                    .collect::<Vec<_>>()
                            })
                        })
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().expect("a source thread"))
                .collect()
        })
    }
}

impl Default for Lab {
    fn default() -> Self {
        Self::new()
    }
}

fn verdict(allowed: bool) -> &'static str {
    if allowed { "allow" } else { "deny" }
}

/// Registers a pod's endpoint with the agent; with [`LabelSource::Registration`] its labels ride
/// along.
fn register(
    agent: &AgentProcess,
    pod: &ModelPod,
    name: &str,
    host: &str,
    handle: &str,
    ip: Ipv4Addr,
) {
    let id = format!("{}-{name}", pod.namespace);
    let labels = match LABEL_SOURCE {
        LabelSource::Registration => json!(pod.labels),
        LabelSource::PodDocument => json!({}),
    };
    let body = json!({
        "container_id": id, "ifname": "eth0", "host_ifname": host, "namespace": pod.namespace,
        "pod": name, "labels": labels, "handle": handle, "ips": [ip.to_string()],
    });
    let _: Value = agent
        .api(
            Method::PUT,
            &format!("/v1/endpoints/{id}:eth0"),
            Some(&body),
        )
        .expect("register the pod's endpoint");
}

/// A pod's Pod object as the API server serves it: its labels, its named container ports and
/// its address.
fn pod_object(p: &LabPod) -> Value {
    let ports: Vec<Value> = NAMED_PORTS
        .iter()
        .map(|(name, proto, port)| {
            let protocol = match proto {
                Proto::Tcp => "TCP",
                Proto::Udp => "UDP",
                Proto::Sctp => "SCTP",
            };
            json!({"name": name, "containerPort": port, "protocol": protocol})
        })
        .collect();
    let ip = p.ip.to_string();
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": p.name, "namespace": p.model.namespace, "labels": p.model.labels},
           "spec": {"containers": [{"name": "serve", "image": "pause", "ports": ports}]},
           "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}})
}

/// The `kind: Pod` documents the policy directory carries: every pod's labels and its named
/// container ports (none while labels come with the registration).
fn pod_documents(pods: &[LabPod]) -> Vec<String> {
    match LABEL_SOURCE {
        LabelSource::Registration => Vec::new(),
        LabelSource::PodDocument => {
            let ports: Vec<(&str, &str, u16)> = NAMED_PORTS
                .iter()
                .map(|(name, proto, port)| {
                    let protocol = match proto {
                        Proto::Tcp => "TCP",
                        Proto::Udp => "UDP",
                        Proto::Sctp => "SCTP",
                    };
                    (*name, protocol, *port)
                })
                .collect();
            pods.iter()
                .map(|p| {
                    let labels: Vec<(&str, &str)> = p
                        .model
                        .labels
                        .iter()
                        .map(|(k, v)| (k.as_str(), v.as_str()))
                        .collect();
                    crate::pod_doc::pod_yaml(&p.model.namespace, &p.name, &labels, &ports)
                })
                .collect()
        }
    }
}
