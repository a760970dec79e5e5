//! One object at a time (a watching source's per-object deltas): one policy or one namespace's
//! labels changes exactly as [`Calculation::set_policies`] would change it within a whole set,
//! without diffing the rest of the set.

use std::collections::{BTreeMap, HashMap};

use super::{Calculation, NO_LABELS};
use crate::calc::{
    identity::{IdentityError, LabelSet},
    policy::model::{Peer, Policy},
};

impl Calculation {
    /// Adds or replaces (`Some`) or removes (`None`) the policy `key` (namespace, name). True
    /// when anything changed.
    pub fn set_policy(
        &mut self,
        key: &(String, String),
        policy: Option<&Policy>,
    ) -> Result<bool, IdentityError> {
        let old = self
            .policy_index
            .get(key)
            .and_then(|id| self.policies.get(*id))
            .map(|state| &state.policy);
        if old == policy {
            return Ok(false);
        }
        // Allocate first: nothing changes unless every identity the policy needs is persisted.
        if let Some(policy) = policy {
            for rule in policy.ingress.iter().chain(&policy.egress) {
                for peer in &rule.peers {
                    if let Peer::Cidr { cidr, except } = peer {
                        for net in std::iter::once(cidr).chain(except) {
                            if !self.cidr_identities.contains_key(net) {
                                let id = self.identities.allocate(&LabelSet::for_cidr(net))?;
                                self.cidr_identities.insert(*net, id);
                            }
                        }
                    }
                }
            }
            self.identities.persist_allocated()?;
        }
        if self.policy_index.contains_key(key) {
            self.remove_policy(key);
        }
        if let Some(policy) = policy {
            self.add_policy(key.clone(), policy.clone());
        }
        Ok(true)
    }

    /// Sets (`Some`) or forgets (`None`) namespace `namespace`'s labels: its classes move to
    /// their new identities and namespace selectors are matched again. True when its labels
    /// changed.
    pub fn set_namespace(
        &mut self,
        namespace: &str,
        labels: Option<&BTreeMap<String, String>>,
    ) -> Result<bool, IdentityError> {
        let new = labels.unwrap_or(&NO_LABELS);
        if self.namespace_labels(namespace) == new {
            self.store_namespace(namespace, labels);
            return Ok(false);
        }
        let mut relabelled = HashMap::new();
        for id in self
            .classes_by_namespace
            .get(namespace)
            .into_iter()
            .flatten()
        {
            if let Some(class) = self.classes.get(*id) {
                let set = LabelSet::for_pod(&class.labels, namespace, new);
                relabelled.insert(*id, self.identities.allocate(&set)?);
            }
        }
        self.identities.persist_allocated()?;
        self.store_namespace(namespace, labels);
        self.relabel_namespace(namespace, &relabelled);
        self.named_inputs_changed();
        Ok(true)
    }

    fn store_namespace(&mut self, namespace: &str, labels: Option<&BTreeMap<String, String>>) {
        match labels {
            Some(labels) => {
                self.namespaces.insert(namespace.to_owned(), labels.clone());
            }
            None => {
                self.namespaces.remove(namespace);
            }
        }
    }
}
