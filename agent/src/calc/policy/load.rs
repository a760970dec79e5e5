//! Reading `--policy-dir`: every `*.yaml`/`*.yml`/`*.json` file, several documents per file.
//! A document that fails to parse or validate is reported with file, line and reason; the caller
//! keeps the last good state in force.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    time::SystemTime,
};

use k8s_openapi::api::{
    core::v1::{Namespace, Node, Pod, Service},
    discovery::v1::EndpointSlice,
    networking::v1::NetworkPolicy,
};
use serde::Deserialize as _;

use super::{convert, model::PolicySet, warnings};

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

pub(super) fn policy_files(dir: &Path) -> Vec<PathBuf> {
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
    let loaded = load_dir_full(dir);
    (loaded.set, loaded.errors)
}

/// One object of the directory, by kind and key.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ObjectRef {
    /// A NetworkPolicy (namespace, name).
    Policy(String, String),
    /// A Namespace.
    Namespace(String),
    /// A Pod (namespace, name).
    Pod(String, String),
    /// A Node.
    Node(String),
    /// A Service (namespace, name).
    Service(String, String),
    /// An EndpointSlice (namespace, name).
    EndpointSlice(String, String),
}

/// What a read of the directory found: the valid objects (and the file of each), the reports,
/// and which object each refused document meant (None: unknown, e.g. the rest of a file after
/// a YAML syntax error, or an unreadable file).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Loaded {
    /// The valid objects.
    pub set: PolicySet,
    /// Every refused document.
    pub errors: Vec<PolicyFileError>,
    /// The file of every valid object.
    pub origins: BTreeMap<ObjectRef, PathBuf>,
    /// Refused documents: their file and, when it could be told, the object they meant.
    pub refused: Vec<(PathBuf, Option<ObjectRef>)>,
    /// The line each valid object's document starts on (in its file of `origins`).
    pub lines: BTreeMap<ObjectRef, usize>,
    /// Objects that apply with a caveat (`policy::warnings`), with file and line: not refusals.
    pub warnings: Vec<PolicyFileError>,
}

/// Reads every policy file of `dir` with what the last-good merge needs (`last_good`).
#[must_use]
pub fn load_dir_full(dir: &Path) -> Loaded {
    let mut loaded = Loaded::default();
    for file in policy_files(dir) {
        load_file(&file, &mut loaded);
    }
    with_warnings(loaded)
}

/// Reads one policy file into `loaded` (an unreadable file is a refusal of everything it held).
/// False when it could not be read.
pub(super) fn load_file(file: &Path, loaded: &mut Loaded) -> bool {
    load_file_with(file, None, loaded)
}

/// [`load_file`], reusing `docs`' parse of every document it still holds and refilling `docs`
/// with the file's documents.
pub(super) fn load_file_with(
    file: &Path,
    docs: Option<&mut DocCache>,
    loaded: &mut Loaded,
) -> bool {
    match fs::read_to_string(file) {
        Ok(text) => {
            load_documents(file, &text, docs, loaded);
            true
        }
        Err(e) => {
            loaded.errors.push(PolicyFileError {
                file: file.to_owned(),
                line: 0,
                reason: format!("cannot read: {e}"),
            });
            loaded.refused.push((file.to_owned(), None));
            false
        }
    }
}

/// `loaded` with the caveats of its whole set (`policy::warnings`), each with its file and line.
pub(super) fn with_warnings(mut loaded: Loaded) -> Loaded {
    loaded.warnings = warnings::check(&loaded.set)
        .into_iter()
        .map(|w| PolicyFileError {
            file: loaded.origins.get(&w.object).cloned().unwrap_or_default(),
            line: loaded.lines.get(&w.object).copied().unwrap_or(0),
            reason: w.reason,
        })
        .collect();
    loaded
}

/// The object a document means, from its kind and metadata alone (so also for a bad one).
fn object_ref(kind: &str, value: &serde_norway::Value) -> Option<ObjectRef> {
    let meta = value.get("metadata")?;
    let name = meta.get("name")?.as_str()?.to_owned();
    let namespace = || {
        meta.get("namespace")
            .and_then(|n| n.as_str())
            .unwrap_or(convert::DEFAULT_NAMESPACE)
            .to_owned()
    };
    match kind {
        "NetworkPolicy" => Some(ObjectRef::Policy(namespace(), name)),
        "Namespace" => Some(ObjectRef::Namespace(name)),
        "Pod" => Some(ObjectRef::Pod(namespace(), name)),
        "Node" => Some(ObjectRef::Node(name)),
        "Service" => Some(ObjectRef::Service(namespace(), name)),
        "EndpointSlice" => Some(ObjectRef::EndpointSlice(namespace(), name)),
        _ => None,
    }
}

/// Line (1-based) at which each YAML document of `text` starts: the line after its `---`, or
/// line 1 for a first document with none.
fn document_lines(text: &str) -> Vec<usize> {
    let mut starts = vec![1];
    for (i, line) in text.lines().enumerate() {
        if line.trim_end() == "---" {
            if i == 0 {
                // A leading separator opens the first document; it is not a second one.
                starts[0] = 2;
            } else {
                starts.push(i + 2);
            }
        }
    }
    starts
}

/// The kinds a policy directory may hold.
pub const SUPPORTED_KINDS: &str = "NetworkPolicy, Namespace, Pod, Node, Service and EndpointSlice";

fn parse<T: serde::de::DeserializeOwned>(
    value: serde_norway::Value,
    what: &str,
) -> Result<T, String> {
    serde_norway::from_value::<T>(value).map_err(|e| format!("not a valid {what}: {e}"))
}

/// Parses the documents of one file into `set`, pushing every problem to `errors`.
pub fn load_text(file: &Path, text: &str, set: &mut PolicySet, errors: &mut Vec<PolicyFileError>) {
    let mut loaded = Loaded {
        set: std::mem::take(set),
        errors: std::mem::take(errors),
        ..Loaded::default()
    };
    load_into(file, text, &mut loaded);
    *set = loaded.set;
    *errors = loaded.errors;
}

/// One document's parse, kept by its text ([`DocCache`]): its objects and reports with lines
/// counted from the document's first line, and whether it ended the file's parse (bad YAML).
#[derive(Clone, Debug, Default)]
pub(super) struct DocParse {
    loaded: Loaded,
    complete: bool,
}

/// The parse of each document of a file, by the document's text: an edit of one document of a
/// large file parses that document only.
pub(super) type DocCache = std::collections::HashMap<String, DocParse>;

/// The documents of `text` as (first line, text), split at its `---` lines; None when the text
/// uses what a split on lines cannot follow (directives, `...` ends, content after `---`), which
/// is then parsed as one stream.
fn split_documents(text: &str) -> Option<Vec<(usize, &str)>> {
    let mut docs = Vec::new();
    let (mut start, mut start_line, mut at) = (0, 1, 0);
    for (i, line) in text.split_inclusive('\n').enumerate() {
        let bare = line.trim_end();
        if bare.starts_with('%') || bare.starts_with("...") {
            return None;
        }
        if bare.starts_with("---") {
            if bare != "---" {
                return None;
            }
            docs.push((start_line, &text[start..at]));
            start = at + line.len();
            start_line = i + 2;
        }
        at += line.len();
    }
    docs.push((start_line, &text[start..]));
    Some(docs)
}

/// Parses the documents of one file into `loaded`, each on its own (reusing `cache`'s parse of
/// a document whose text it holds, and refilling `cache` with this text's documents) when the
/// text splits at its `---` lines, else as one stream. After a document that is not valid YAML
/// the rest of the file is not read, as in a stream.
fn load_documents(file: &Path, text: &str, cache: Option<&mut DocCache>, loaded: &mut Loaded) {
    let Some(docs) = split_documents(text) else {
        load_stream(file, text, loaded);
        return;
    };
    let mut cache = cache;
    let mut old = cache.as_deref_mut().map(std::mem::take);
    let mut fresh = DocCache::new();
    for (first_line, doc) in docs {
        let kept = old.as_mut().and_then(|o| o.remove(doc));
        let parsed = match kept.or_else(|| fresh.get(doc).cloned()) {
            Some(parsed) => parsed,
            None => parse_document(file, first_line, doc),
        };
        if !parsed.complete {
            // Bad YAML: its report is in the file's lines (never kept: its place may change).
            merge_document(loaded, &parsed.loaded, 0);
            break;
        }
        merge_document(loaded, &parsed.loaded, first_line - 1);
        if cache.is_some() {
            fresh.insert(doc.to_owned(), parsed);
        }
    }
    if let Some(c) = cache {
        *c = fresh;
    }
}

/// One document's parse, with lines counted from its first line; when it is not valid YAML, its
/// parse where it stands in the file (the parser's message names the file's line and column).
fn parse_document(file: &Path, first_line: usize, doc: &str) -> DocParse {
    let mut loaded = Loaded::default();
    if load_stream(file, doc, &mut loaded) {
        return DocParse {
            loaded,
            complete: true,
        };
    }
    let mut placed = Loaded::default();
    let text = format!("{}{doc}", "\n".repeat(first_line - 1));
    load_stream(file, &text, &mut placed);
    DocParse {
        loaded: placed,
        complete: false,
    }
}

/// Adds one document's parse (lines counted from its first line) after the documents before it.
pub(super) fn merge_document(loaded: &mut Loaded, doc: &Loaded, line_offset: usize) {
    let shifted = |e: &PolicyFileError| PolicyFileError {
        line: e.line + line_offset,
        ..e.clone()
    };
    let (set, from) = (&mut loaded.set, &doc.set);
    set.policies
        .extend(from.policies.iter().map(|(k, v)| (k.clone(), v.clone())));
    for (name, labels) in &from.namespaces {
        set.namespaces.insert(name.clone(), labels.clone());
        match from.namespace_annotations.get(name) {
            Some(a) => set.namespace_annotations.insert(name.clone(), a.clone()),
            None => set.namespace_annotations.remove(name),
        };
    }
    set.pods
        .extend(from.pods.iter().map(|(k, v)| (k.clone(), v.clone())));
    set.nodes
        .extend(from.nodes.iter().map(|(k, v)| (k.clone(), v.clone())));
    set.services
        .extend(from.services.iter().map(|(k, v)| (k.clone(), v.clone())));
    set.endpoint_slices.extend(
        from.endpoint_slices
            .iter()
            .map(|(k, v)| (k.clone(), v.clone())),
    );
    loaded.errors.extend(doc.errors.iter().map(shifted));
    loaded.refused.extend(doc.refused.iter().cloned());
    loaded
        .origins
        .extend(doc.origins.iter().map(|(k, v)| (k.clone(), v.clone())));
    loaded
        .lines
        .extend(doc.lines.iter().map(|(k, v)| (k.clone(), v + line_offset)));
}

fn load_into(file: &Path, text: &str, loaded: &mut Loaded) {
    load_documents(file, text, None, loaded);
}

#[cfg(test)]
thread_local! {
    /// Streams parsed on this thread (tests count what a cached read parses).
    pub(super) static STREAMS_PARSED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Parses `text` as one YAML stream into `loaded`; false when it stopped at bad YAML.
fn load_stream(file: &Path, text: &str, loaded: &mut Loaded) -> bool {
    #[cfg(test)]
    STREAMS_PARSED.with(|n| n.set(n.get() + 1));
    let Loaded {
        set,
        errors,
        origins,
        refused,
        lines,
        warnings: _,
    } = loaded;
    let starts = document_lines(text);
    for (index, document) in serde_norway::Deserializer::from_str(text).enumerate() {
        let doc_line = starts.get(index).copied().unwrap_or(1);
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
                refused.push((file.to_owned(), None));
                return false;
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
        let object = object_ref(&kind, &value);
        let result = match kind.as_str() {
            "NetworkPolicy" => parse::<NetworkPolicy>(value, "networking.k8s.io/v1 NetworkPolicy")
                .and_then(|np| convert::policy(&np).map_err(|e| e.to_string()))
                .map(|p| {
                    set.policies
                        .insert((p.namespace.clone(), p.name.clone()), p);
                }),
            "Namespace" => parse::<Namespace>(value, "v1 Namespace")
                .and_then(|ns| {
                    let annotations = convert::weir_annotations(&ns.metadata);
                    convert::namespace(&ns)
                        .map(|(name, labels)| (name, labels, annotations))
                        .map_err(|e| e.to_string())
                })
                .map(|(name, labels, annotations)| {
                    if annotations.is_empty() {
                        set.namespace_annotations.remove(&name);
                    } else {
                        set.namespace_annotations.insert(name.clone(), annotations);
                    }
                    set.namespaces.insert(name, labels);
                }),
            "Pod" => parse::<Pod>(value, "v1 Pod")
                .and_then(|pod| convert::pod(&pod).map_err(|e| e.to_string()))
                .map(|pod| {
                    set.pods
                        .insert((pod.namespace.clone(), pod.name.clone()), pod);
                }),
            "Node" => parse::<Node>(value, "v1 Node")
                .and_then(|node| convert::node(&node).map_err(|e| e.to_string()))
                .map(|node| {
                    set.nodes.insert(node.name.clone(), node);
                }),
            "Service" => parse::<Service>(value, "v1 Service")
                .and_then(|s| {
                    crate::calc::services::convert::service(&s).map_err(|e| e.to_string())
                })
                .map(|s| {
                    set.services
                        .insert((s.namespace.clone(), s.name.clone()), s);
                }),
            "EndpointSlice" => parse::<EndpointSlice>(value, "discovery.k8s.io/v1 EndpointSlice")
                .and_then(|s| {
                    crate::calc::services::convert::endpoint_slice(&s).map_err(|e| e.to_string())
                })
                .map(|s| {
                    set.endpoint_slices
                        .insert((s.namespace.clone(), s.name.clone()), s);
                }),
            "" => Err(format!(
                "the document has no `kind`; write one of {SUPPORTED_KINDS}"
            )),
            other => Err(format!(
                "kind {other:?} is not supported here; only {SUPPORTED_KINDS}"
            )),
        };
        match (result, object) {
            (Err(reason), object) => {
                errors.push(err(doc_line, reason));
                refused.push((file.to_owned(), object));
            }
            (Ok(()), Some(object)) => {
                lines.insert(object.clone(), doc_line);
                origins.insert(object, file.to_owned());
            }
            (Ok(()), None) => {}
        }
    }
    true
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
    use crate::calc::policy::model::PortSpec;

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
    fn pods_and_nodes_load_beside_policies() {
        let text = "kind: Pod\nmetadata: {name: a, namespace: prod, labels: {app: web}}\nspec: {nodeName: n2, containers: [{name: c, ports: [{name: http, containerPort: 8080}]}]}\nstatus: {podIP: 10.9.0.5}\n---\nkind: Node\nmetadata: {name: n2}\nstatus: {addresses: [{type: InternalIP, address: 192.0.2.2}]}\n";
        let set = parse_str("c.yaml", text).expect("valid");
        let pod = &set.pods[&("prod".to_owned(), "a".to_owned())];
        assert_eq!(pod.labels["app"], "web");
        assert_eq!(pod.named_ports[0].port, 8080);
        assert_eq!(set.nodes["n2"].addresses.len(), 1);
        let errors = parse_str(
            "c.yaml",
            &format!("{text}---\nkind: Pod\nmetadata: {{name: b}}\nstatus: {{podIP: x}}\n"),
        )
        .expect_err("bad pod");
        assert_eq!(errors.len(), 1);
        assert_eq!(
            errors[0].to_string(),
            "c.yaml:10: status.podIP: \"x\" is not an IP address"
        );
    }

    /// Files whose documents parse alike one by one and as one stream (lines included).
    const SPLITTABLE: &[&str] = &[
        GOOD,
        "---\nkind: Namespace\nmetadata: {name: a}\n---\n---\nkind: Namespace\nmetadata: {name: b}\n---\n",
        "kind: Pod\nmetadata: {name: p, namespace: a}\nspec: [bad]\n---\nkind: Namespace\nmetadata: {name: a}\n",
        "kind: Namespace\nmetadata: {name: a}\n---\nkind: [unclosed\n---\nkind: Namespace\nmetadata: {name: b}\n",
        "kind: Namespace\r\nmetadata: {name: a}\r\n---\r\nkind: Widget\r\nmetadata: {name: w}\r\n",
        "kind: Namespace\nmetadata: {name: a, labels: {x: '1'}}\n---\nkind: Namespace\nmetadata: {name: a}\n",
    ];

    #[test]
    fn documents_parsed_one_by_one_equal_the_stream() {
        for text in SPLITTABLE {
            let (mut split, mut stream) = (Loaded::default(), Loaded::default());
            assert!(split_documents(text).is_some(), "{text:?}");
            load_into(Path::new("f.yaml"), text, &mut split);
            load_stream(Path::new("f.yaml"), text, &mut stream);
            assert_eq!(split, stream, "{text:?}");
        }
        // What a split cannot follow is parsed as one stream.
        for text in [
            "%YAML 1.2\n---\nkind: Namespace\n",
            "a: 1\n...\n",
            "--- {kind: Namespace}\n",
        ] {
            assert!(split_documents(text).is_none(), "{text:?}");
        }
    }

    #[test]
    fn an_edit_of_one_document_parses_that_document_only() {
        let file = Path::new("f.yaml");
        let mut docs = DocCache::new();
        let first = |docs: &mut DocCache, text: &str| {
            let before = STREAMS_PARSED.with(std::cell::Cell::get);
            let mut loaded = Loaded::default();
            load_documents(file, text, Some(docs), &mut loaded);
            (loaded, STREAMS_PARSED.with(std::cell::Cell::get) - before)
        };
        let (_, parsed) = first(&mut docs, GOOD);
        assert_eq!(parsed, split_documents(GOOD).map(|d| d.len()).unwrap_or(0));
        let edited = GOOD.replace("team: a", "team: z");
        let (loaded, parsed) = first(&mut docs, &edited);
        assert_eq!(parsed, 1, "only the edited document");
        let mut whole = Loaded::default();
        load_stream(file, &edited, &mut whole);
        assert_eq!(loaded, whole);
        assert_eq!(loaded.set.namespaces["prod"]["team"], "z");
        let (_, parsed) = first(&mut docs, &edited);
        assert_eq!(parsed, 0, "nothing changed");
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
                "kind: NetworkPolicy\nmetadata: {name: x}\nspec: {podSelector: {}, ingress: [{ports: [{port: Http_1}]}]}\n",
                "port name",
            ),
            (
                "kind: NetworkPolicy\nmetadata: {name: x}\nspec: {podSelector: {}, policyTypes: [Sideways]}\n",
                "policyTypes",
            ),
            (
                "kind: NetworkPolicy\nmetadata: {name: x}\nspec: {podSelector: {matchExpressions: [{key: a, operator: Near}]}}\n",
                "operator",
            ),
            ("kind: Deployment\nmetadata: {name: x}\n", "not supported"),
            // A syntax error is reported where the parser finds it, not at its document's start.
            ("a: [unclosed\nb: c\n", "not valid YAML"),
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
            // The bad document starts on line 5 (after a leading `---` and a valid Namespace);
            // the YAML error is where the parser meets `b: c` inside the open `[`, line 6.
            let line = if needle == "not valid YAML" { 6 } else { 5 };
            assert_eq!(errors[0].line, line, "{message}");
            assert!(
                message.starts_with(&format!("bad.yaml:{line}: ")),
                "{message}"
            );
            assert!(
                message.contains(needle),
                "{message} does not mention {needle}"
            );
        }
        let errors = parse_str(
            "bad.yaml",
            "kind: Namespace\nmetadata: {name: a}\n---\nkind: Service\n",
        )
        .expect_err("a Service without a name");
        assert_eq!(errors[0].line, 4, "the failing document's first line");
    }
}
