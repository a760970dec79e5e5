//! The cluster model and NetworkPolicy: `convert` turns each Kubernetes object (`networking.k8s.io/v1`
//! NetworkPolicy, `v1` Namespace, Pod and Node) into the validated `model`, for the standalone
//! directory and the Kubernetes watchers alike; `load` reads every YAML document of `--policy-dir`
//! through it, reporting each bad document with file, line and reason; `compile` turns the model,
//! the endpoints and their identities into policy-map entries, isolation flags and ipcache entries.
//!
//! `ipBlock` selects CIDR identities (the block, minus its `except` prefixes, which fall back to
//! whatever identity the address has without this block — usually world), not pod addresses —
//! as in Cilium. Overlapping blocks from several policies are a union.

pub mod compile;
pub mod convert;
pub mod delta;
pub mod last_good;
pub mod load;
pub mod load_cache;
pub mod model;
pub mod pods;
pub mod selector;
pub mod warnings;
