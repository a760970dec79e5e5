//! The link watcher as a source of the dataplane loop, kept alive: it runs over the kernel seam's
//! [`LinkIo`] (rtnetlink in the agent, the fake kernel's link table in tests), its events go to
//! the loop as [`Command::Link`]; when it stops (its netlink socket failed, or the stream ended) the loop is
//! told (the agent turns not-ready), and it is restarted with backoff. A restarted watcher dumps
//! links and addresses again; what the previous run reported and the new dump lacks is sent as
//! gone before the new `Synced`, so nothing that vanished meanwhile stays desired.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    time::{Duration, Instant},
};

use futures_util::StreamExt as _;

use crate::{
    control::applier::{Command, LoopHandle},
    kernel::{LinkEvent, LinkIo, LinkWatcherStopped},
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
            LinkEvent::Synced | LinkEvent::Drift(_) => {}
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

/// Runs the link watcher over `links` (the real one is [`crate::kernel::real::netlink_links::Netlink`])
/// forever, restarting it with backoff, until the loop is gone. `on_up` runs for every workload
/// link reported (the agent's per-link sysctls).
pub async fn supervise(handle: LoopHandle, links: impl LinkIo, on_up: impl Fn(&str)) {
    supervise_into(|command| handle.send(command).is_ok(), &links, on_up).await;
}

/// [`supervise`] sending each command through `send` (false: the loop is gone).
async fn supervise_into(
    send: impl Fn(Command) -> bool,
    links: &(impl LinkIo + ?Sized),
    on_up: impl Fn(&str),
) {
    let mut seen = Seen::default();
    let mut backoff = MIN_BACKOFF;
    loop {
        let started = Instant::now();
        let Some(reason) = run(&send, links, &mut seen, &on_up).await else {
            return;
        };
        if started.elapsed() >= HEALTHY_RUN {
            backoff = MIN_BACKOFF;
        }
        tracing::error!(error = %reason, retry_in_ms = backoff.as_millis(), "link watcher stopped; the agent is not ready until it is back");
        if !send(Command::LinkWatcherDown(reason)) {
            return;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// One run of the watcher: the dump, `Synced`, then live events until the stream ends. Returns
/// why it stopped, or `None` when the loop is gone.
async fn run(
    send: &impl Fn(Command) -> bool,
    links: &(impl LinkIo + ?Sized),
    seen: &mut Seen,
    on_up: &impl Fn(&str),
) -> Option<LinkWatcherStopped> {
    let watch = match links.watch().await {
        Ok(watch) => watch,
        Err(e) => return Some(e.into()),
    };
    // Until this run's `Synced`, its events are the dump.
    let mut dump = Some(Seen::default());
    for event in watch.dump.into_iter().chain([LinkEvent::Synced]) {
        if !forward(send, seen, &mut dump, event, on_up) {
            return None;
        }
    }
    let mut events = watch.events;
    while let Some(event) = events.next().await {
        match event {
            Ok(event) => {
                if !forward(send, seen, &mut dump, event, on_up) {
                    return None;
                }
            }
            Err(e) => return Some(e.into()),
        }
    }
    Some(LinkWatcherStopped::Ended)
}

/// Sends one event on; false when the loop is gone.
fn forward(
    send: &impl Fn(Command) -> bool,
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
    events.into_iter().all(|e| send(Command::Link(e)))
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tokio::sync::mpsc;

    use super::*;
    use crate::kernel::fake::FakeKernel;

    /// What the loop was sent, comparable.
    #[derive(Debug, PartialEq)]
    enum Sent {
        Link(LinkEvent),
        Down(String),
    }

    const WAIT: Duration = Duration::from_secs(20);

    fn up(ifname: &str, ifindex: u32) -> Sent {
        Sent::Link(LinkEvent::Up {
            ifname: ifname.into(),
            ifindex,
            up: true,
        })
    }

    fn address(addr: IpAddr, present: bool) -> Sent {
        Sent::Link(LinkEvent::Address {
            ifindex: 1,
            addr,
            present,
        })
    }

    /// The supervisor over `kernel`, its commands on the returned channel; the links `on_up`
    /// saw in the shared list.
    fn start(
        kernel: &FakeKernel,
    ) -> (
        mpsc::UnboundedReceiver<Sent>,
        Arc<Mutex<Vec<String>>>,
        tokio::task::JoinHandle<()>,
    ) {
        let (tx, rx) = mpsc::unbounded_channel();
        let ups = Arc::new(Mutex::new(Vec::new()));
        let (kernel, seen) = (kernel.clone(), Arc::clone(&ups));
        let task = tokio::spawn(async move {
            let send = move |c: Command| {
                let sent = match c {
                    Command::Link(e) => Sent::Link(e),
                    Command::LinkWatcherDown(reason) => Sent::Down(reason.to_string()),
                    _ => unreachable!("the link source sends only link commands"),
                };
                tx.send(sent).is_ok()
            };
            supervise_into(send, &kernel, |ifname| {
                seen.lock().expect("lock").push(ifname.to_owned());
            })
            .await;
        });
        (rx, ups, task)
    }

    /// The next `n` commands (bounded wait).
    async fn next(rx: &mut mpsc::UnboundedReceiver<Sent>, n: usize) -> Vec<Sent> {
        let mut out = Vec::new();
        while out.len() < n {
            match tokio::time::timeout(WAIT, rx.recv()).await {
                Ok(Some(sent)) => out.push(sent),
                other => panic!("after {out:?}: no command within {WAIT:?}: {other:?}"),
            }
        }
        out
    }

    fn kernel() -> (FakeKernel, IpAddr) {
        let kernel = FakeKernel::default();
        let addr: IpAddr = "192.0.2.1".parse().expect("addr");
        kernel.add_link("weira", 10);
        kernel.add_link("weirb", 11);
        kernel.add_link("eth9", 12);
        kernel.set_address(1, addr, true);
        (kernel, addr)
    }

    #[tokio::test]
    async fn the_dump_then_synced_then_live_events_reach_the_loop() {
        let (kernel, addr) = kernel();
        let (mut rx, ups, task) = start(&kernel);
        assert_eq!(
            next(&mut rx, 4).await,
            vec![
                up("weira", 10),
                up("weirb", 11),
                address(addr, true),
                Sent::Link(LinkEvent::Synced)
            ],
            "workload links and addresses, not eth9"
        );
        kernel.add_link("weirc", 13);
        kernel.add_link("eth10", 14);
        kernel.remove_link("weira");
        kernel.set_address(1, addr, false);
        assert_eq!(
            next(&mut rx, 3).await,
            vec![
                up("weirc", 13),
                Sent::Link(LinkEvent::Gone {
                    ifname: "weira".into()
                }),
                address(addr, false),
            ]
        );
        assert_eq!(*ups.lock().expect("lock"), ["weira", "weirb", "weirc"]);
        assert!(rx.try_recv().is_err(), "nothing else: eth10 is no workload");
        task.abort();
    }

    #[tokio::test]
    async fn a_dead_watcher_turns_not_ready_is_restarted_and_what_vanished_is_gone() {
        let (kernel, addr) = kernel();
        let (mut rx, _ups, task) = start(&kernel);
        assert_eq!(next(&mut rx, 4).await.len(), 4, "the first dump");
        // The stream ends; while no watcher runs, weirb and the address go (no event sees it).
        kernel.end_link_watches(None);
        kernel.remove_link("weirb");
        kernel.set_address(1, addr, false);
        assert_eq!(
            next(&mut rx, 1).await,
            vec![Sent::Down("its netlink stream ended".into())],
            "the loop is told the watcher died (not ready)"
        );
        assert_eq!(
            next(&mut rx, 4).await,
            vec![
                up("weira", 10),
                Sent::Link(LinkEvent::Gone {
                    ifname: "weirb".into()
                }),
                address(addr, false),
                Sent::Link(LinkEvent::Synced),
            ],
            "the restarted watcher's dump, what it lacks as gone, then Synced"
        );
        assert_eq!(kernel.link_table().opened, 2);
        // An error in the stream is a dead watcher too, and its message is the reason.
        kernel.end_link_watches(Some("netlink overrun"));
        let down = next(&mut rx, 1).await;
        assert!(
            matches!(&down[..], [Sent::Down(r)] if r.contains("netlink overrun")),
            "{down:?}"
        );
        assert_eq!(
            next(&mut rx, 2).await,
            vec![up("weira", 10), Sent::Link(LinkEvent::Synced)],
            "nothing more vanished"
        );
        task.abort();
    }

    #[tokio::test]
    async fn a_watch_that_cannot_open_is_retried_with_growing_backoff() {
        let (kernel, _addr) = kernel();
        kernel.link_table().fail_opens = 2;
        let (mut rx, _ups, task) = start(&kernel);
        let first = next(&mut rx, 1).await;
        let failed = Instant::now();
        assert!(
            matches!(&first[..], [Sent::Down(r)] if r.contains("cannot open a netlink socket")),
            "{first:?}"
        );
        let second = next(&mut rx, 1).await;
        assert!(matches!(&second[..], [Sent::Down(_)]), "{second:?}");
        let third = next(&mut rx, 4).await;
        assert!(
            failed.elapsed() >= MIN_BACKOFF * 3,
            "the retries wait 100 ms, then 200 ms"
        );
        assert_eq!(third.last(), Some(&Sent::Link(LinkEvent::Synced)));
        assert_eq!(kernel.link_table().opened, 1);
        task.abort();
    }

    #[tokio::test]
    async fn the_supervisor_ends_when_the_loop_is_gone() {
        let (kernel, _addr) = kernel();
        let (mut rx, _ups, task) = start(&kernel);
        assert_eq!(next(&mut rx, 4).await.len(), 4);
        drop(rx);
        kernel.add_link("weird", 20);
        tokio::time::timeout(WAIT, task)
            .await
            .expect("the supervisor ends")
            .expect("no panic");
    }

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
