//! The in-process tier (as ztunnel's direct tests): the agent's real sources (the registry and
//! policy files on disk, the link watcher's events through its supervisor, the API's commands)
//! → the dataplane loop → the real drivers over a fake kernel. Tests assert the fake's final
//! state against a fresh full compile of the same sources, and count its writes; the host
//! interfaces' drivers (prefilter, masquerade) are driven the same way (`host`).

mod api;
mod converge;
pub(crate) mod harness;
mod host;
mod inspect;
mod pod_wait;
mod pods;
mod services;
