//! The link watcher as a source of the dataplane loop, kept alive: its events go to the loop as
//! [`Command::Link`]; when it stops (its netlink socket failed, or the stream ended) the loop is
//! told (the agent turns not-ready), and it is restarted with backoff. A restarted watcher dumps
//! links and addresses again; what the previous run reported and the new dump lacks is sent as
//! gone before the new `Synced`, so nothing that vanished meanwhile stays desired.

use std::{
    collections::{BTreeMap, BTreeSet},
    future::Future,
    net::IpAddr,
    time::{Duration, Instant},
};

use tokio::sync::mpsc;

use crate::{
    applier::{Command, LoopHandle},
    sources::linkwatch::{LinkEvent, LinkWatchError},
};

const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A run that lasted this long resets the backoff.
const HEALTHY_RUN: Duration = Duration::from_secs(60);

/// What the watcher reported, to tell a restart what vanished.
#[derive(Default)]
struct Seen {
    links: BTreeMap<String, u32>,
    addresses: BTreeSet<(u32, IpAddr)>,
}

impl Seen {
    fn record(&mut self, event: &LinkEvent) {
        match event {
            LinkEvent::Up {
                ifname, ifindex, ..
            } => {
                self.links.insert(ifname.clone(), *ifindex);
            }
            LinkEvent::Gone { ifname } => {
                self.links.remove(ifname);
            }
            LinkEvent::Address {
                ifindex,
                addr,
                present,
            } => {
                if *present {
                    self.addresses.insert((*ifindex, *addr));
                } else {
                    self.addresses.remove(&(*ifindex, *addr));
                }
            }
            LinkEvent::Synced => {}
        }
    }

    /// The events that retract what `self` holds and `dump` does not.
    fn vanished(&self, dump: &Self) -> Vec<LinkEvent> {
        let links = self
            .links
            .keys()
            .filter(|name| !dump.links.contains_key(*name))
            .map(|name| LinkEvent::Gone {
                ifname: name.clone(),
            });
        let addresses = self
            .addresses
            .difference(&dump.addresses)
            .map(|(ifindex, addr)| LinkEvent::Address {
                ifindex: *ifindex,
                addr: *addr,
                present: false,
            });
        links.chain(addresses).collect()
    }
}

/// Runs `watch` (the real one is [`crate::sources::linkwatch::watch`]) forever, restarting it with
/// backoff, until the loop is gone. `on_up` runs for every workload link reported (the agent's
/// per-link sysctls).
pub async fn supervise<W, F>(handle: LoopHandle, watch: W, on_up: impl Fn(&str))
where
    W: Fn(mpsc::UnboundedSender<LinkEvent>) -> F,
    F: Future<Output = Result<(), LinkWatchError>>,
{
    let mut seen = Seen::default();
    let mut backoff = MIN_BACKOFF;
    loop {
        let started = Instant::now();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let run = watch(tx);
        tokio::pin!(run);
        // Until this run's first `Synced`, its events are the dump.
        let mut dump = Some(Seen::default());
        let outcome = loop {
            tokio::select! {
                biased;
                event = rx.recv() => {
                    // The watcher dropped its sender: it is ending.
                    let Some(event) = event else { break (&mut run).await };
                    if !forward(&handle, &mut seen, &mut dump, event, &on_up) {
                        return;
                    }
                }
                outcome = &mut run => break outcome,
            }
        };
        // What the watcher sent before it ended still counts.
        while let Ok(event) = rx.try_recv() {
            if !forward(&handle, &mut seen, &mut dump, event, &on_up) {
                return;
            }
        }
        let reason = match outcome {
            Ok(()) => "its netlink stream ended".to_owned(),
            Err(e) => e.to_string(),
        };
        if started.elapsed() >= HEALTHY_RUN {
            backoff = MIN_BACKOFF;
        }
        tracing::error!(error = %reason, retry_in_ms = backoff.as_millis(), "link watcher stopped; the agent is not ready until it is back");
        if handle.send(Command::LinkWatcherDown(reason)).is_err() {
            return;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Sends one event on; false when the loop is gone.
fn forward(
    handle: &LoopHandle,
    seen: &mut Seen,
    dump: &mut Option<Seen>,
    event: LinkEvent,
    on_up: &impl Fn(&str),
) -> bool {
    if let LinkEvent::Up { ifname, .. } = &event {
        on_up(ifname);
    }
    let mut events = Vec::new();
    match (&event, dump.as_mut()) {
        (LinkEvent::Synced, Some(_)) => {
            if let Some(fresh) = dump.take() {
                events = seen.vanished(&fresh);
                for gone in &events {
                    seen.record(gone);
                }
            }
        }
        (_, Some(fresh)) => fresh.record(&event),
        (_, None) => {}
    }
    seen.record(&event);
    events.push(event);
    events
        .into_iter()
        .all(|e| handle.send(Command::Link(e)).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restart_retracts_what_the_new_dump_lacks() {
        let mut before = Seen::default();
        let addr: IpAddr = "192.0.2.1".parse().expect("addr");
        for e in [
            LinkEvent::Up {
                ifname: "weira".into(),
                ifindex: 10,
                up: true,
            },
            LinkEvent::Up {
                ifname: "weirb".into(),
                ifindex: 11,
                up: true,
            },
            LinkEvent::Address {
                ifindex: 1,
                addr,
                present: true,
            },
        ] {
            before.record(&e);
        }
        let mut dump = Seen::default();
        dump.record(&LinkEvent::Up {
            ifname: "weira".into(),
            ifindex: 10,
            up: true,
        });
        assert_eq!(
            before.vanished(&dump),
            vec![
                LinkEvent::Gone {
                    ifname: "weirb".into()
                },
                LinkEvent::Address {
                    ifindex: 1,
                    addr,
                    present: false
                },
            ]
        );
        assert!(dump.vanished(&dump).is_empty(), "nothing vanished");
    }
}
