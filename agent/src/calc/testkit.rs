//! Test helpers: a dataplane over in-memory maps that record every kernel write, so a test can
//! assert exactly which keys an apply wrote; sources made of plain values.

use std::{
    collections::{BTreeMap, HashMap},
    hash::Hash,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use maps_schema::{EndpointInfo, IdentityInfo, PolicyKey, PolicyValue};

use weir_api::Endpoint;

use crate::{
    dataplane::{
        attachments::{AttachDriver, Attacher, Hook},
        endpoints::EndpointsManager,
        map_driver::MapDriver,
        plane::Dataplane,
    },
    kernel::{KernelError, MapIo, Prefix, TcAttachType},
};

/// One kernel operation: a write (`Some`) or a delete (`None`).
pub(crate) type Op<K, V> = (K, Option<V>);

struct Inner<K, V> {
    entries: HashMap<K, V>,
    ops: Vec<Op<K, V>>,
}

/// An in-memory map recording the operations applied to it; clones share it.
pub(crate) struct Recorder<K, V> {
    name: String,
    inner: Arc<Mutex<Inner<K, V>>>,
}

impl<K, V> Clone for Recorder<K, V> {
    fn clone(&self) -> Self {
        Self {
            name: self.name.clone(),
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<K: Clone + Eq + Hash, V: Clone> Recorder<K, V> {
    fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            inner: Arc::new(Mutex::new(Inner {
                entries: HashMap::new(),
                ops: Vec::new(),
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner<K, V>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The operations since the last call.
    pub(crate) fn take_ops(&self) -> Vec<Op<K, V>> {
        std::mem::take(&mut self.lock().ops)
    }

    /// What the map holds.
    pub(crate) fn contents(&self) -> HashMap<K, V> {
        self.lock().entries.clone()
    }
}

impl<K: Clone + Eq + Hash + Send, V: Clone + Send> MapIo<K, V> for Recorder<K, V> {
    fn name(&self) -> &str {
        &self.name
    }

    fn read_all(&self) -> Result<Vec<(K, V)>, KernelError> {
        Ok(self
            .lock()
            .entries
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    fn write(&mut self, key: &K, value: &V) -> Result<(), KernelError> {
        let mut inner = self.lock();
        inner.entries.insert(key.clone(), value.clone());
        inner.ops.push((key.clone(), Some(value.clone())));
        Ok(())
    }

    fn delete(&mut self, key: &K) -> Result<(), KernelError> {
        let mut inner = self.lock();
        inner.entries.remove(key);
        inner.ops.push((key.clone(), None));
        Ok(())
    }

    fn pin_present(&self) -> bool {
        true
    }

    fn repin(&mut self) -> Result<(), KernelError> {
        Ok(())
    }
}

/// Links that are always in place (map tests do not attach anything).
struct NoAttach;

impl Attacher for NoAttach {
    fn pinned(&self) -> Result<Vec<(String, String)>, KernelError> {
        Ok(Vec::new())
    }
    fn has_pin(&self, _ifname: &str, _program: &str) -> bool {
        true
    }
    fn hook(
        &mut self,
        _ifname: &str,
        _ifindex: u32,
        _program: &str,
        _hook: TcAttachType,
    ) -> Result<Hook, KernelError> {
        Ok(Hook {
            ours: Some(1),
            leftovers: false,
        })
    }
    fn current(&self, _program: &str) -> u32 {
        1
    }
    fn link_exists(&self, _ifname: &str, _ifindex: u32) -> bool {
        true
    }
    fn attach(&mut self, _: &str, _: u32, _: &str, _: TcAttachType) -> Result<(), KernelError> {
        Ok(())
    }
    fn update(&mut self, _: &str, _: u32, _: &str, _: TcAttachType) -> Result<(), KernelError> {
        Ok(())
    }
    fn sweep(&mut self, _: &str, _: u32, _: &str, _: TcAttachType) -> Result<u64, KernelError> {
        Ok(0)
    }
    fn unpin(&mut self, _ifname: &str, _program: &str) -> Result<(), KernelError> {
        Ok(())
    }
}

/// The recording maps behind a test dataplane.
#[derive(Clone)]
pub(crate) struct Maps {
    pub(crate) endpoints: Recorder<u32, EndpointInfo>,
    pub(crate) ident4: Recorder<[u8; 4], IdentityInfo>,
    pub(crate) ident6: Recorder<[u8; 16], IdentityInfo>,
    pub(crate) ipcache4: Recorder<Prefix<[u8; 4]>, IdentityInfo>,
    pub(crate) ipcache6: Recorder<Prefix<[u8; 16]>, IdentityInfo>,
    pub(crate) policy: Recorder<PolicyKey, PolicyValue>,
}

/// Every operation of one apply, by map.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Writes {
    pub(crate) endpoints: Vec<Op<u32, EndpointInfo>>,
    pub(crate) ident4: Vec<Op<[u8; 4], IdentityInfo>>,
    pub(crate) ident6: Vec<Op<[u8; 16], IdentityInfo>>,
    pub(crate) ipcache4: Vec<Op<Prefix<[u8; 4]>, IdentityInfo>>,
    pub(crate) ipcache6: Vec<Op<Prefix<[u8; 16]>, IdentityInfo>>,
    pub(crate) policy: Vec<Op<PolicyKey, PolicyValue>>,
}

impl Writes {
    /// Total operations.
    pub(crate) fn len(&self) -> usize {
        self.endpoints.len()
            + self.ident4.len()
            + self.ident6.len()
            + self.ipcache4.len()
            + self.ipcache6.len()
            + self.policy.len()
    }
}

impl Maps {
    /// The operations since the last call.
    pub(crate) fn take(&self) -> Writes {
        Writes {
            endpoints: self.endpoints.take_ops(),
            ident4: self.ident4.take_ops(),
            ident6: self.ident6.take_ops(),
            ipcache4: self.ipcache4.take_ops(),
            ipcache6: self.ipcache6.take_ops(),
            policy: self.policy.take_ops(),
        }
    }
}

/// A dataplane over new, empty recording maps.
pub(crate) fn dataplane() -> (Dataplane, Maps) {
    let maps = Maps {
        endpoints: Recorder::new("endpoints_v1"),
        ident4: Recorder::new("ident4_v1"),
        ident6: Recorder::new("ident6_v1"),
        ipcache4: Recorder::new("ipcache4_v1"),
        ipcache6: Recorder::new("ipcache6_v1"),
        policy: Recorder::new("policy_v1"),
    };
    (dataplane_over(&maps), maps)
}

/// A new dataplane (as after a restart) over the maps an earlier one wrote.
pub(crate) fn dataplane_over(maps: &Maps) -> Dataplane {
    Dataplane {
        attachments: AttachDriver::new(Box::new(NoAttach)),
        endpoints: MapDriver::new(Box::new(maps.endpoints.clone())),
        endpoints_manager: EndpointsManager::new(),
        ident4: MapDriver::new(Box::new(maps.ident4.clone())),
        ident6: MapDriver::new(Box::new(maps.ident6.clone())),
        ipcache4: MapDriver::new(Box::new(maps.ipcache4.clone())),
        ipcache6: MapDriver::new(Box::new(maps.ipcache6.clone())),
        policy: MapDriver::new(Box::new(maps.policy.clone())),
        services: crate::dataplane::services::ServiceMaps::new(
            Box::new(Recorder::new(maps_schema::service::SVC4)),
            Box::new(Recorder::new(maps_schema::service::SVC_SLOTS)),
            Box::new(Recorder::new(maps_schema::service::SVC_MEMBERS)),
            Box::new(Recorder::new(maps_schema::service::SVC_BACKENDS4)),
            Box::new(Recorder::new(maps_schema::service::SVC_REVNAT4)),
        ),
    }
}

/// A workload endpoint with made-up names derived from `n`.
pub(crate) fn endpoint(n: u32, namespace: &str, labels: &[(&str, &str)], ips: &[&str]) -> Endpoint {
    Endpoint {
        id: 0,
        container_id: format!("c{n:05}"),
        ifname: "eth0".into(),
        host_ifname: format!("weir{n:011x}"),
        netns: String::new(),
        namespace: namespace.into(),
        pod: format!("pod{n}"),
        labels: labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<BTreeMap<_, _>>(),
        handle: String::new(),
        ips: ips.iter().filter_map(|ip| ip.parse().ok()).collect(),
    }
}
