//! The reference compile: the kernel state the sources on disk (registry, identities, policy
//! directory) call for, computed by a fresh full compile with none of the node's or the loop's
//! state. The in-process tests compare the fake kernel with it, and `cargo xtask bench policy`
//! counts the writes a change must cause from the difference of two of them.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    hash::Hash,
    net::IpAddr,
};

use maps_schema::{EndpointInfo, IdentityInfo, PolicyKey, PolicyValue};

use crate::{
    calc::{
        identity::{Identities, IdentityError, LabelSet},
        policy::{
            compile::{Subject, compile as compile_policies},
            load::PolicyFileError,
        },
    },
    dataplane::endpoints,
    kernel::Prefix,
    paths::Paths,
    sources::registry::{Registry, RegistryError},
};

/// Why the reference could not be computed.
#[derive(Debug, thiserror::Error)]
pub enum ReferenceError {
    /// The registry does not load.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// The identities do not load, or a new one cannot be allocated in the scratch copy.
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// A policy document is refused.
    #[error("the policy directory has a refused document: {0}")]
    Policy(PolicyFileError),
    /// The scratch copy of the identities failed.
    #[error("cannot copy the identities to a scratch file: {0}")]
    Scratch(#[source] std::io::Error),
}

/// The kernel state the drivers reconcile, as maps.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct State {
    pub endpoints: HashMap<u32, EndpointInfo>,
    pub ident4: HashMap<[u8; 4], IdentityInfo>,
    pub ident6: HashMap<[u8; 16], IdentityInfo>,
    pub ipcache4: HashMap<Prefix<[u8; 4]>, IdentityInfo>,
    pub ipcache6: HashMap<Prefix<[u8; 16]>, IdentityInfo>,
    pub policy: HashMap<PolicyKey, PolicyValue>,
}

/// A map key of any of the maps, to compare what was written with what had to be.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AnyKey {
    Endpoint(u32),
    Ident4([u8; 4]),
    Ident6([u8; 16]),
    Ipcache4(u32, [u8; 4]),
    Ipcache6(u32, [u8; 16]),
    Policy(u32, u32, u16, u8, u8),
}

/// The [`AnyKey`] of a policy key.
pub fn policy_key(k: &PolicyKey) -> AnyKey {
    AnyKey::Policy(
        k.endpoint_id,
        k.peer_identity,
        k.port,
        k.protocol,
        k.direction,
    )
}

fn changed<K: Eq + Hash + Clone, V: PartialEq>(
    before: &HashMap<K, V>,
    after: &HashMap<K, V>,
    wrap: impl Fn(&K) -> AnyKey,
    out: &mut BTreeSet<AnyKey>,
) {
    for (k, v) in after {
        if before.get(k) != Some(v) {
            out.insert(wrap(k));
        }
    }
    for k in before.keys() {
        if !after.contains_key(k) {
            out.insert(wrap(k));
        }
    }
}

impl State {
    /// Entries in every map.
    pub fn entries(&self) -> usize {
        self.endpoints.len()
            + self.ident4.len()
            + self.ident6.len()
            + self.ipcache4.len()
            + self.ipcache6.len()
            + self.policy.len()
    }

    /// The keys whose value differs between `self` and `after` (added, changed, removed).
    pub fn diff(&self, after: &Self) -> BTreeSet<AnyKey> {
        let mut out = BTreeSet::new();
        changed(
            &self.endpoints,
            &after.endpoints,
            |k| AnyKey::Endpoint(*k),
            &mut out,
        );
        changed(
            &self.ident4,
            &after.ident4,
            |k| AnyKey::Ident4(*k),
            &mut out,
        );
        changed(
            &self.ident6,
            &after.ident6,
            |k| AnyKey::Ident6(*k),
            &mut out,
        );
        changed(
            &self.ipcache4,
            &after.ipcache4,
            |k| AnyKey::Ipcache4(k.len, k.data),
            &mut out,
        );
        changed(
            &self.ipcache6,
            &after.ipcache6,
            |k| AnyKey::Ipcache6(k.len, k.data),
            &mut out,
        );
        changed(&self.policy, &after.policy, policy_key, &mut out);
        out
    }
}

/// The kernel state of every endpoint in the registry whose host link is in `links` (host link
/// → ifindex); identities come from a scratch copy of the identity file, so the numbers are the
/// agent's.
pub fn compile(paths: &Paths, links: &BTreeMap<String, u32>) -> Result<State, ReferenceError> {
    let registry = Registry::load(&paths.registry())?;
    let scratch = std::env::temp_dir().join(format!(
        "weir-reference-{}-{:?}.json",
        std::process::id(),
        std::thread::current().id()
    ));
    let copied = match std::fs::copy(paths.identities(), &scratch) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(ReferenceError::Scratch(e)),
    };
    let result = copied.and_then(|()| compile_with(&registry, &scratch, paths, links));
    match std::fs::remove_file(&scratch) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            tracing::warn!(error = %e, path = %scratch.display(), "cannot remove the scratch identities");
        }
        _ => {}
    }
    result
}

fn compile_with(
    registry: &Registry,
    identities_path: &std::path::Path,
    paths: &Paths,
    links: &BTreeMap<String, u32>,
) -> Result<State, ReferenceError> {
    let mut identities = Identities::load(identities_path)?;
    let (set, errors) = crate::calc::policy::load::load_dir(&paths.policy_dir);
    if let Some(e) = errors.into_iter().next() {
        return Err(ReferenceError::Policy(e));
    }
    // Local endpoints with their Pod's labels when the directory has the Pod.
    let effective: Vec<_> = registry
        .endpoints()
        .map(|e| crate::calc::policy::pods::effective(e, &set))
        .collect();
    let endpoints: Vec<&weir_api::Endpoint> = effective.iter().map(AsRef::as_ref).collect();
    let empty = BTreeMap::new();
    let mut ids = Vec::with_capacity(endpoints.len());
    for e in &endpoints {
        let ns = set.namespaces.get(&e.namespace).unwrap_or(&empty);
        ids.push(identities.get_or_allocate(&LabelSet::for_pod(&e.labels, &e.namespace, ns))?);
    }
    let subjects: Vec<Subject<'_>> = endpoints
        .iter()
        .zip(&ids)
        .map(|(endpoint, identity)| Subject {
            endpoint,
            identity: *identity,
        })
        .collect();
    let mut compiled = compile_policies(&set, &subjects, &mut identities)?;
    // The full compile numbers rules by position; the agent hashes them (`calc::rule_ids`).
    // Allocated in the compile's (sorted) order, as the agent does from empty.
    let mut rule_ids = crate::calc::rule_ids::RuleIds::default();
    let rule_id_of: Vec<u32> = compiled
        .rules
        .iter()
        .map(|r| rule_ids.allocate(r.clone()))
        .collect();
    for value in compiled.policy.values_mut() {
        if let Some(id) = usize::try_from(value.rule_id)
            .ok()
            .and_then(|i| i.checked_sub(1))
            .and_then(|i| rule_id_of.get(i))
        {
            value.rule_id = *id;
        }
    }
    let mut state = State {
        ident4: compiled
            .remote
            .iter()
            .filter_map(|(ip, id)| match ip {
                IpAddr::V4(a) => Some((
                    a.octets(),
                    IdentityInfo {
                        identity: *id,
                        flags: 0,
                    },
                )),
                IpAddr::V6(_) => None,
            })
            .collect(),
        ident6: compiled
            .remote
            .iter()
            .filter_map(|(ip, id)| match ip {
                IpAddr::V6(a) => Some((
                    a.octets(),
                    IdentityInfo {
                        identity: *id,
                        flags: 0,
                    },
                )),
                IpAddr::V4(_) => None,
            })
            .collect(),
        ipcache4: compiled.ipcache4,
        ipcache6: compiled.ipcache6,
        policy: compiled.policy,
        ..State::default()
    };
    for (e, identity) in endpoints.iter().zip(&ids) {
        let info = IdentityInfo {
            identity: *identity,
            flags: 0,
        };
        for ip in &e.ips {
            match ip {
                IpAddr::V4(a) => state.ident4.insert(a.octets(), info),
                IpAddr::V6(a) => state.ident6.insert(a.octets(), info),
            };
        }
        if let Some(ifindex) = links.get(&e.host_ifname) {
            let flags = compiled.flags.get(&e.id).copied().unwrap_or(0);
            state
                .endpoints
                .insert(*ifindex, endpoints::entry(e, *identity, flags));
        }
    }
    Ok(state)
}
