//! Reading `--policy-dir`: every `*.yaml`/`*.yml`/`*.json` file, several documents per file.
//! A document that fails to parse or validate is reported with file, line and reason; the caller
//! keeps the last good state in force.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    time::SystemTime,
};

use k8s_openapi::{
    api::{
        core::v1::Namespace,
        networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort},
    },
    apimachinery::pkg::util::intstr::IntOrString,
};
use serde::Deserialize as _;

use super::{
    model::{Peer, Policy, PolicySet, PortSpec, Rule},
    selector::Selector,
};

/// A document that could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}:{line}: {reason}", file.display())]
pub struct PolicyFileError {
    /// The file.
    pub file: PathBuf,
    /// 1-based line where the problem (or its document) starts.
    pub line: usize,
    /// What is wrong and how to fix it.
    pub reason: String,
}

/// A fingerprint of the directory: (file, modification time, length) of every policy file.
pub type Fingerprint = Vec<(PathBuf, Option<SystemTime>, u64)>;

fn policy_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.is_file()
                && p.extension()
                    .is_some_and(|e| e == "yaml" || e == "yml" || e == "json")
        })
        .collect();
    files.sort();
    files
}

/// The directory's fingerprint (cheap: one `stat` per file), to notice edits.
#[must_use]
pub fn fingerprint(dir: &Path) -> Fingerprint {
    policy_files(dir)
        .into_iter()
        .map(|p| {
            let meta = fs::metadata(&p).ok();
            let modified = meta.as_ref().and_then(|m| m.modified().ok());
            let len = meta.map_or(0, |m| m.len());
            (p, modified, len)
        })
        .collect()
}

/// Reads and validates every policy file of `dir` (a missing directory is an empty set): the
/// documents that are valid, and a report of every one that is not.
#[must_use]
pub fn load_dir(dir: &Path) -> (PolicySet, Vec<PolicyFileError>) {
    let mut set = PolicySet::default();
    let mut errors = Vec::new();
    for file in policy_files(dir) {
        match fs::read_to_string(&file) {
            Ok(text) => load_text(&file, &text, &mut set, &mut errors),
            Err(e) => errors.push(PolicyFileError {
                file,
                line: 0,
                reason: format!("cannot read: {e}"),
            }),
        }
    }
    (set, errors)
}

/// Line (1-based) at which each YAML document of `text` starts.
fn document_lines(text: &str) -> Vec<usize> {
    let mut starts = vec![1];
    for (i, line) in text.lines().enumerate() {
        if line.trim_end() == "---" && i > 0 {
            starts.push(i + 2);
        }
    }
    starts
}

/// Parses the documents of one file into `set`, pushing every problem to `errors`.
pub fn load_text(file: &Path, text: &str, set: &mut PolicySet, errors: &mut Vec<PolicyFileError>) {
    let starts = document_lines(text);
    let leading_separator = text.lines().next().is_some_and(|l| l.trim_end() == "---");
    for (index, document) in serde_norway::Deserializer::from_str(text).enumerate() {
        let doc_line = starts
            .get(index + usize::from(leading_separator))
            .copied()
            .unwrap_or(1);
        let err = |line: usize, reason: String| PolicyFileError {
            file: file.to_owned(),
            line,
            reason,
        };
        let value = match serde_norway::Value::deserialize(document) {
            Ok(v) => v,
            Err(e) => {
                let line = e.location().map_or(doc_line, |l| l.line());
                errors.push(err(line, format!("not valid YAML: {e}")));
                break;
            }
        };
        if value.is_null() {
            continue;
        }
        let kind = value
            .get("kind")
            .and_then(|k| k.as_str())
            .unwrap_or_default()
            .to_owned();
        let result = match kind.as_str() {
            "NetworkPolicy" => serde_norway::from_value::<NetworkPolicy>(value)
                .map_err(|e| format!("not a valid networking.k8s.io/v1 NetworkPolicy: {e}"))
                .and_then(|np| convert(&np))
                .map(|p| {
                    set.policies
                        .insert((p.namespace.clone(), p.name.clone()), p);
                }),
            "Namespace" => serde_norway::from_value::<Namespace>(value)
                .map_err(|e| format!("not a valid v1 Namespace: {e}"))
                .and_then(|ns| {
                    let name = ns
                        .metadata
                        .name
                        .clone()
                        .ok_or("a Namespace needs metadata.name")?;
                    set.namespaces
                        .insert(name, ns.metadata.labels.clone().unwrap_or_default());
                    Ok(())
                }),
            "" => Err(
                "the document has no `kind`; write kind: NetworkPolicy or kind: Namespace"
                    .to_owned(),
            ),
            other => Err(format!(
                "kind {other:?} is not supported here; only NetworkPolicy and Namespace"
            )),
        };
        if let Err(reason) = result {
            errors.push(err(doc_line, reason));
        }
    }
}

/// One NetworkPolicy into the model (shared by the files and the Kubernetes source).
pub(crate) fn convert(np: &NetworkPolicy) -> Result<Policy, String> {
    let name = np
        .metadata
        .name
        .clone()
        .ok_or("a NetworkPolicy needs metadata.name")?;
    let namespace = np
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".to_owned());
    let spec = np.spec.clone().unwrap_or_default();
    let pod_selector = Selector::from_k8s(&spec.pod_selector.clone().unwrap_or_default())
        .map_err(|e| format!("spec.podSelector: {e}"))?;
    let ingress_rules = spec.ingress.clone().unwrap_or_default();
    let egress_rules = spec.egress.clone().unwrap_or_default();
    let (ingress_isolated, egress_isolated) = match &spec.policy_types {
        Some(types) => {
            for t in types {
                if t != "Ingress" && t != "Egress" {
                    return Err(format!("spec.policyTypes: {t:?} is not Ingress or Egress"));
                }
            }
            (
                types.iter().any(|t| t == "Ingress"),
                types.iter().any(|t| t == "Egress"),
            )
        }
        None => (true, spec.egress.is_some()),
    };
    let rules = |rules: &[NetworkPolicyRule], what: &str| -> Result<Vec<Rule>, String> {
        rules
            .iter()
            .enumerate()
            .map(|(i, r)| rule(r).map_err(|e| format!("spec.{what}[{i}]: {e}")))
            .collect()
    };
    Ok(Policy {
        namespace,
        name,
        pod_selector,
        ingress_isolated,
        egress_isolated,
        ingress: rules(
            &ingress_rules
                .iter()
                .map(|r| NetworkPolicyRule {
                    peers: r.from.clone(),
                    ports: r.ports.clone(),
                })
                .collect::<Vec<_>>(),
            "ingress",
        )?,
        egress: rules(
            &egress_rules
                .iter()
                .map(|r| NetworkPolicyRule {
                    peers: r.to.clone(),
                    ports: r.ports.clone(),
                })
                .collect::<Vec<_>>(),
            "egress",
        )?,
    })
}

/// A rule of either direction, with its peers (`from` or `to`).
struct NetworkPolicyRule {
    peers: Option<Vec<NetworkPolicyPeer>>,
    ports: Option<Vec<NetworkPolicyPort>>,
}

fn rule(r: &NetworkPolicyRule) -> Result<Rule, String> {
    let peers = r
        .peers
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, p)| peer(p).map_err(|e| format!("peer {i}: {e}")))
        .collect::<Result<_, _>>()?;
    let ports = r
        .ports
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, p)| port(p).map_err(|e| format!("ports[{i}]: {e}")))
        .collect::<Result<_, _>>()?;
    Ok(Rule { peers, ports })
}

fn peer(p: &NetworkPolicyPeer) -> Result<Peer, String> {
    if let Some(block) = &p.ip_block {
        if p.pod_selector.is_some() || p.namespace_selector.is_some() {
            return Err(
                "ipBlock cannot be combined with podSelector or namespaceSelector in one peer"
                    .into(),
            );
        }
        let cidr: ipnetwork::IpNetwork = block
            .cidr
            .parse()
            .map_err(|_| format!("ipBlock.cidr {:?} is not a CIDR", block.cidr))?;
        let mut except = Vec::new();
        for e in block.except.iter().flatten() {
            let net: ipnetwork::IpNetwork = e
                .parse()
                .map_err(|_| format!("ipBlock.except {e:?} is not a CIDR"))?;
            if net.is_ipv4() != cidr.is_ipv4()
                || net.prefix() <= cidr.prefix()
                || !cidr.contains(net.network())
            {
                return Err(format!(
                    "ipBlock.except {e} must be a strictly smaller prefix inside {cidr}"
                ));
            }
            except.push(net);
        }
        return Ok(Peer::Cidr {
            cidr: ipnetwork::IpNetwork::new(cidr.network(), cidr.prefix())
                .map_err(|e| e.to_string())?,
            except,
        });
    }
    if p.pod_selector.is_none() && p.namespace_selector.is_none() {
        return Err("a peer needs podSelector, namespaceSelector or ipBlock".into());
    }
    let namespaces = p
        .namespace_selector
        .as_ref()
        .map(Selector::from_k8s)
        .transpose()
        .map_err(|e| format!("namespaceSelector: {e}"))?;
    let pods = p
        .pod_selector
        .as_ref()
        .map(Selector::from_k8s)
        .transpose()
        .map_err(|e| format!("podSelector: {e}"))?;
    Ok(Peer::Pods { namespaces, pods })
}

fn port(p: &NetworkPolicyPort) -> Result<PortSpec, String> {
    let protocol = match p.protocol.as_deref().unwrap_or("TCP") {
        "TCP" => 6,
        "UDP" => 17,
        "SCTP" => 132,
        other => return Err(format!("protocol {other:?} is not TCP, UDP or SCTP")),
    };
    let port = match &p.port {
        None => None,
        Some(IntOrString::Int(n)) => Some(
            u16::try_from(*n)
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("port {n} is not between 1 and 65535"))?,
        ),
        Some(IntOrString::String(name)) => {
            return Err(format!(
                "named port {name:?} is not supported yet; use the port number"
            ));
        }
    };
    let end_port = match p.end_port {
        None => None,
        Some(_) if port.is_none() => return Err("endPort needs port".into()),
        Some(end) => {
            let end = u16::try_from(end)
                .ok()
                .filter(|e| Some(*e) >= port)
                .ok_or_else(|| format!("endPort {end} must be between port and 65535"))?;
            Some(end)
        }
    };
    Ok(PortSpec {
        protocol,
        port,
        end_port,
    })
}

/// Parses one file's text (tests and `weir policy` helpers).
pub fn parse_str(file: &str, text: &str) -> Result<PolicySet, Vec<PolicyFileError>> {
    let mut set = PolicySet::default();
    let mut errors = Vec::new();
    load_text(Path::new(file), text, &mut set, &mut errors);
    if errors.is_empty() {
        Ok(set)
    } else {
        Err(errors)
    }
}

/// Namespace labels as a map (for identities).
#[must_use]
pub fn namespace_labels(set: &PolicySet) -> BTreeMap<String, BTreeMap<String, String>> {
    set.namespaces.clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
apiVersion: v1
kind: Namespace
metadata:
  name: prod
  labels: {team: a}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web, namespace: prod}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from:
    - podSelector: {matchLabels: {app: client}}
    - namespaceSelector: {matchLabels: {team: b}}
    - ipBlock: {cidr: 10.0.0.0/8, except: [10.1.0.0/16]}
    ports:
    - {protocol: TCP, port: 80}
    - {protocol: UDP, port: 5000, endPort: 5010}
  egress:
  - {}
"#;

    #[test]
    fn a_good_file_loads() {
        let set = parse_str("good.yaml", GOOD).expect("valid");
        assert_eq!(set.namespaces["prod"]["team"], "a");
        let p = &set.policies[&("prod".to_owned(), "web".to_owned())];
        assert!(p.ingress_isolated && p.egress_isolated);
        assert_eq!(p.ingress[0].peers.len(), 3);
        assert_eq!(
            p.ingress[0].ports[1],
            PortSpec {
                protocol: 17,
                port: Some(5000),
                end_port: Some(5010)
            }
        );
        assert!(
            p.egress[0].peers.is_empty() && p.egress[0].ports.is_empty(),
            "an empty rule allows all"
        );
    }

    #[test]
    fn bad_documents_name_file_line_and_reason() {
        let cases = [
            (
                "kind: NetworkPolicy\nmetadata: {name: x}\nspec: {podSelector: {}, ingress: [{ports: [{port: 0}]}]}\n",
                "port 0",
            ),
            (
                "kind: NetworkPolicy\nmetadata: {name: x}\nspec: {podSelector: {}, ingress: [{from: [{ipBlock: {cidr: nope}}]}]}\n",
                "not a CIDR",
            ),
            (
                "kind: NetworkPolicy\nmetadata: {name: x}\nspec: {podSelector: {}, ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/8, except: [11.0.0.0/16]}}]}]}\n",
                "inside",
            ),
            (
                "kind: NetworkPolicy\nmetadata: {name: x}\nspec: {podSelector: {}, ingress: [{ports: [{port: http}]}]}\n",
                "named port",
            ),
            (
                "kind: NetworkPolicy\nmetadata: {name: x}\nspec: {podSelector: {}, policyTypes: [Sideways]}\n",
                "policyTypes",
            ),
            (
                "kind: NetworkPolicy\nmetadata: {name: x}\nspec: {podSelector: {matchExpressions: [{key: a, operator: Near}]}}\n",
                "operator",
            ),
            ("kind: Pod\nmetadata: {name: x}\n", "not supported"),
            ("a: [unclosed\n", "not valid YAML"),
            (
                "kind: NetworkPolicy\nmetadata: {name: x}\nspec: {podSelector: {}, ingress: [{ports: [{protocol: ICMP}]}]}\n",
                "protocol",
            ),
        ];
        for (text, needle) in cases {
            let errors = parse_str(
                "bad.yaml",
                &format!("---\nkind: Namespace\nmetadata: {{name: ok}}\n---\n{text}"),
            )
            .expect_err(needle);
            let message = errors[0].to_string();
            assert!(
                message.starts_with("bad.yaml:5:") || message.starts_with("bad.yaml:"),
                "{message}"
            );
            assert!(
                message.contains(needle),
                "{message} does not mention {needle}"
            );
        }
        let errors = parse_str(
            "bad.yaml",
            "kind: Namespace\nmetadata: {name: a}\n---\nkind: Pod\n",
        )
        .expect_err("pod");
        assert_eq!(errors[0].line, 4, "the failing document's first line");
    }
}
