//! Remote pods (other nodes' pods, from the source's Pod objects): each joins the label class of
//! its namespace and labels, so the selector cache selects its identity like a local endpoint's,
//! and its addresses carry that identity in the exact-match maps. They have no endpoint entry and
//! no policy entries of their own (their node enforces their policies).

use std::collections::HashMap;

use super::{Calculation, Source};
use crate::calc::{
    identity::{IdentityError, LabelSet},
    policy::pods::RemotePod,
};

impl Calculation {
    /// Replaces the remote pods with `pods` (by key), touching only the ones that changed.
    pub fn set_remote_pods(&mut self, pods: &[RemotePod]) -> Result<(), IdentityError> {
        let new: HashMap<&str, &RemotePod> = pods.iter().map(|p| (p.key.as_str(), p)).collect();
        let changed: Vec<&RemotePod> = pods
            .iter()
            .filter(|p| {
                self.remote_pods
                    .get(&p.key)
                    .is_none_or(|(old, _)| old != *p)
            })
            .collect();
        // Allocate first: nothing changes unless every identity needed is persisted.
        let mut identities = Vec::with_capacity(changed.len());
        for pod in &changed {
            identities.push(self.identities.allocate(&LabelSet::for_pod(
                &pod.labels,
                &pod.namespace,
                self.namespace_labels(&pod.namespace),
            ))?);
        }
        self.identities.persist_allocated()?;
        let gone: Vec<String> = self
            .remote_pods
            .keys()
            .filter(|k| !new.contains_key(k.as_str()))
            .cloned()
            .collect();
        let any = !changed.is_empty() || !gone.is_empty();
        for key in gone {
            self.leave_remote(&key);
        }
        for (pod, identity) in changed.into_iter().zip(identities) {
            self.join_remote(pod, identity);
        }
        if any {
            self.named_inputs_changed();
        }
        Ok(())
    }

    /// Adds or replaces (`Some`) or removes (`None`) the remote pod `key` alone (a watching
    /// source's delta). True when anything changed.
    pub fn set_remote_pod(
        &mut self,
        key: &str,
        pod: Option<&RemotePod>,
    ) -> Result<bool, IdentityError> {
        match pod {
            None => {
                if !self.remote_pods.contains_key(key) {
                    return Ok(false);
                }
                self.leave_remote(key);
            }
            Some(pod) => {
                if self.remote_pods.get(key).is_some_and(|(old, _)| old == pod) {
                    return Ok(false);
                }
                let identity = self.identities.allocate(&LabelSet::for_pod(
                    &pod.labels,
                    &pod.namespace,
                    self.namespace_labels(&pod.namespace),
                ))?;
                self.identities.persist_allocated()?;
                self.join_remote(pod, identity);
            }
        }
        self.named_inputs_changed();
        Ok(true)
    }

    fn join_remote(&mut self, pod: &RemotePod, identity: u32) {
        let source = Source::Remote(pod.key.clone());
        if let Some((old, class)) = self.remote_pods.get(&pod.key) {
            if old.namespace == pod.namespace && old.labels == pod.labels {
                // Only its addresses changed.
                let class = *class;
                let identity = self.classes.get(class).map_or(identity, |c| c.identity);
                for ip in &old.ips {
                    if !pod.ips.contains(ip) {
                        self.ident.unset(*ip, &source);
                    }
                }
                for ip in &pod.ips {
                    self.ident.set(*ip, source.clone(), identity);
                }
                self.remote_pods
                    .insert(pod.key.clone(), (pod.clone(), class));
                return;
            }
            self.leave_remote(&pod.key);
        }
        let class_key = (pod.namespace.clone(), pod.labels.clone());
        let class = match self.class_index.get(&class_key) {
            Some(c) => *c,
            None => self.create_class(class_key, identity),
        };
        let Some(c) = self.classes.get_mut(class) else {
            return;
        };
        c.remote.insert(pod.key.clone());
        let identity = c.identity;
        for ip in &pod.ips {
            self.ident.set(*ip, source.clone(), identity);
        }
        self.remote_pods
            .insert(pod.key.clone(), (pod.clone(), class));
    }

    fn leave_remote(&mut self, key: &str) {
        let Some((pod, class)) = self.remote_pods.remove(key) else {
            return;
        };
        let source = Source::Remote(key.to_owned());
        for ip in &pod.ips {
            self.ident.unset(*ip, &source);
        }
        if let Some(c) = self.classes.get_mut(class) {
            c.remote.remove(key);
            if c.members.is_empty() && c.remote.is_empty() {
                self.destroy_class(class);
            }
        }
    }
}
