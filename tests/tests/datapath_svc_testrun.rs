//! ClusterIP services by `BPF_PROG_TEST_RUN`, in packet-flow order: a client's packet to a
//! frontend leaves `from_endpoint` addressed to the backend `backend_slot(flow_hash(..))` picks,
//! with valid checksums; the backend's reply enters the client from the frontend; a flow keeps
//! its backend when the service's slots change (a new flow follows the new slots); egress policy
//! judges the backend's identity; `ClientIP` affinity keeps a client on its backend across a
//! change of the slots until its timeout or the backend leaves, and follows it to another slot
//! through `svc_members_v1`; a terminating backend that still
//! serves keeps its flows (UDP too) but gets no new one; a new flow whose translated tuple another
//! frontend's live flow holds takes the next backend; a frontend with no ready backend drops under
//! its own reason.

use std::net::{IpAddr, Ipv4Addr};

use aya::maps::HashMap;
use maps_schema::{
    Backend4, PolicyValue, Svc4Key, Svc4Value, SvcCt4Entry, SvcCt4Key,
    endpoint::FLAG_ISOLATED_EGRESS,
    policy::{EGRESS, VERDICT_ALLOW},
    reason::{
        DROP_POLICY_DENIED, DROP_SERVICE_NO_BACKEND, PASS, PASS_ESTABLISHED, PASS_POLICY,
        PASS_RELATED,
    },
    service::{
        Affinity4, Affinity4Key, BACKEND_FLAG_TERMINATING, MemberKey, MemberValue, SVC_AFFINITY4,
        SVC_BACKENDS4, SVC_FLAG_AFFINITY, SVC_MEMBERS, SVC4, backend_slot, flow_hash,
    },
    service_ct::{DIR_ORIGINAL, DIR_REPLY, SVC_CT4},
};
use tests::{
    csum,
    datapath::{Fam, IDENTITIES, Lab, Peer, TC_ACT_OK, TC_ACT_REDIRECT, expect},
    packet::{ACK, PSH, SYN, TCP, UDP, dst_of, src_of},
    svc_maps::{self, Frontend},
};

const CLIENT: usize = 0;
/// The db backend (pod 1) and the web backend (pod 2).
const DB: usize = 1;
const WEB: usize = 2;
const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const WEB_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 20);
const PORT: u16 = 80;
const TARGET: u16 = 8080;

fn v4(lab: &Lab, peer: Peer) -> Ipv4Addr {
    match lab.addr(peer) {
        IpAddr::V4(a) => a,
        IpAddr::V6(_) => unreachable!("an IPv4 lab"),
    }
}

/// A TCP or UDP frame with valid checksums.
fn frame(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16, proto: u8, flags: u8) -> Vec<u8> {
    let l4 = if proto == TCP {
        tests::packet::tcp(sport, dport, flags)
    } else {
        tests::packet::udp(sport, dport)
    };
    csum::with_checksums(tests::packet::eth(
        tests::packet::ETH_P_IP,
        &tests::packet::ipv4(src.octets(), dst.octets(), proto, &l4),
    ))
}

/// Writes a frontend `vip:PORT/proto` (service `id`) with `backends` (backend id, pod) in slot
/// order, all on `TARGET`. Slots beyond the new count are left as they were (the agent's writes
/// order does the same: the count shrinks first).
fn service(lab: &mut Lab, id: u32, vip: Ipv4Addr, proto: u8, backends: &[(u32, usize)]) {
    let backends: Vec<(u32, Ipv4Addr, u16)> = backends
        .iter()
        .map(|(bid, p)| (*bid, v4(lab, Peer::Pod(*p)), TARGET))
        .collect();
    svc_maps::write_service(
        &mut lab.ebpf,
        &Frontend {
            id,
            vip,
            port: PORT,
            protocol: proto,
            backends: &backends,
        },
    );
}

fn remove_backend(lab: &mut Lab, id: u32) {
    let mut m: HashMap<_, u32, Backend4> =
        HashMap::try_from(lab.ebpf.map_mut(SVC_BACKENDS4).expect("backends")).expect("hash");
    m.remove(&id).expect("remove backend");
}

fn svc_ct(lab: &Lab, key: &SvcCt4Key) -> Option<SvcCt4Entry> {
    let m: HashMap<_, SvcCt4Key, SvcCt4Entry> =
        HashMap::try_from(lab.ebpf.map(SVC_CT4).expect("svc_ct4")).expect("lru");
    m.get(key, 0).ok()
}

fn svc_ct_len(lab: &Lab) -> usize {
    let m: HashMap<_, SvcCt4Key, SvcCt4Entry> =
        HashMap::try_from(lab.ebpf.map(SVC_CT4).expect("svc_ct4")).expect("lru");
    m.keys().count()
}

fn ct_key(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16, proto: u8, dir: u8) -> SvcCt4Key {
    SvcCt4Key {
        saddr: src.octets(),
        daddr: dst.octets(),
        sport,
        dport,
        protocol: proto,
        direction: dir,
        _pad: [0; 2],
    }
}

/// The pod `backends[backend_slot(flow_hash(..))]` sends a client flow to.
fn chosen(lab: &Lab, sport: u16, vip: Ipv4Addr, proto: u8, backends: &[usize]) -> usize {
    let client = v4(lab, Peer::Pod(CLIENT)).octets();
    let hash = flow_hash(client, sport, vip.octets(), PORT, proto, false);
    let count = u16::try_from(backends.len()).expect("count");
    backends[usize::from(backend_slot(hash, count).expect("a slot"))]
}

/// A client port whose flow the hash sends to `want` among `backends`.
fn port_to(lab: &Lab, want: usize, vip: Ipv4Addr, proto: u8, backends: &[usize]) -> u16 {
    (40_000..41_000)
        .find(|p| chosen(lab, *p, vip, proto, backends) == want)
        .expect("some port hashes to each backend")
}

fn lab(test: &str) -> Option<Lab> {
    let mut lab = Lab::new(test, Fam::V4)?;
    for i in 0..3 {
        lab.register(i, 0);
    }
    Some(lab)
}

#[test]
fn translated_to_a_backend_and_the_reply_from_the_frontend() {
    let Some(mut lab) = lab("translated_to_a_backend_and_the_reply_from_the_frontend") else {
        return;
    };
    let client = v4(&lab, Peer::Pod(CLIENT));
    for proto in [TCP, UDP] {
        service(&mut lab, 1, VIP, proto, &[(1, DB), (2, WEB)]);
        for sport in [40_000u16, 40_001, 40_002, 40_003] {
            let want = chosen(&lab, sport, VIP, proto, &[DB, WEB]);
            let backend = v4(&lab, Peer::Pod(want));
            let out_flags = if proto == TCP { SYN } else { 0 };
            let (o, out) = lab.from_out(CLIENT, &frame(client, sport, VIP, PORT, proto, out_flags));
            expect("to the frontend, leaving the client", o, PASS);
            assert_eq!(
                dst_of(&out),
                (backend, TARGET),
                "proto {proto} port {sport}: DNAT"
            );
            assert_eq!(src_of(&out), (client, sport), "the source is untouched");
            csum::assert_valid("translated", &out);
            assert!(
                lab.ct(Peer::Pod(CLIENT), sport, Peer::Pod(want), TARGET, proto)
                    .is_some(),
                "conntrack holds the translated flow"
            );
            let fwd = svc_ct(&lab, &ct_key(client, sport, VIP, PORT, proto, DIR_ORIGINAL))
                .expect("the flow's backend is recorded");
            assert_eq!((Ipv4Addr::from(fwd.addr), fwd.port), (backend, TARGET));
            expect("entering the backend", lab.to(want, &out), PASS);

            let reply_flags = if proto == TCP { SYN | ACK } else { 0 };
            let reply = frame(backend, TARGET, client, sport, proto, reply_flags);
            expect(
                "the reply leaves the backend",
                lab.from(want, &reply),
                PASS_ESTABLISHED,
            );
            let (o, back) = lab.to_out(CLIENT, &reply);
            expect("the reply enters the client", o, PASS_ESTABLISHED);
            assert_eq!(src_of(&back), (VIP, PORT), "reply comes from the frontend");
            assert_eq!(dst_of(&back), (client, sport));
            csum::assert_valid("reverse translated", &back);
            // Conntrack layout 3: the flow's own entry names the frontend; `svc_ct4` holds no
            // reply entry for a pod's flow any more (one insert per new flow).
            let entry = lab
                .ct(Peer::Pod(CLIENT), sport, Peer::Pod(want), TARGET, proto)
                .expect("the flow's conntrack entry");
            assert_eq!(entry.rev_nat, 1, "the conntrack entry names the service");
            assert!(
                svc_ct(
                    &lab,
                    &ct_key(backend, TARGET, client, sport, proto, DIR_REPLY)
                )
                .is_none(),
                "no reply entry in svc_ct4"
            );

            // The next packet of the flow goes the same way, as an established flow.
            let data_flags = if proto == TCP { ACK | PSH } else { 0 };
            let (o, out) =
                lab.from_out(CLIENT, &frame(client, sport, VIP, PORT, proto, data_flags));
            expect("data leaving the client", o, PASS_ESTABLISHED);
            assert_eq!(dst_of(&out), (backend, TARGET));
            csum::assert_valid("translated data", &out);
        }
    }
    // A packet to no frontend is untouched (and the programs still decide it as before).
    let plain = frame(client, 40_100, v4(&lab, Peer::Pod(DB)), TARGET, TCP, SYN);
    let (o, out) = lab.from_out(CLIENT, &plain);
    expect("to a pod directly", o, PASS);
    assert_eq!(out, plain, "not a service packet: untouched");
    let (o, out) = lab.to_out(DB, &plain);
    expect("entering that pod", o, PASS);
    assert_eq!(out, plain);
}

#[test]
fn a_flow_keeps_its_backend_when_the_slots_change() {
    let Some(mut lab) = lab("a_flow_keeps_its_backend_when_the_slots_change") else {
        return;
    };
    let client = v4(&lab, Peer::Pod(CLIENT));
    service(&mut lab, 1, VIP, TCP, &[(1, DB), (2, WEB)]);
    let sport = port_to(&lab, DB, VIP, TCP, &[DB, WEB]);
    let db = v4(&lab, Peer::Pod(DB));
    let (o, out) = lab.from_out(CLIENT, &frame(client, sport, VIP, PORT, TCP, SYN));
    expect("SYN", o, PASS);
    assert_eq!(dst_of(&out).0, db);

    // The db backend leaves the EndpointSlice: only web is in the slots (and a third slot
    // count would not matter either).
    service(&mut lab, 1, VIP, TCP, &[(2, WEB)]);
    remove_backend(&mut lab, 1);
    let (o, out) = lab.from_out(CLIENT, &frame(client, sport, VIP, PORT, TCP, ACK | PSH));
    expect("data of the established flow", o, PASS_ESTABLISHED);
    assert_eq!(dst_of(&out), (db, TARGET), "the flow stays on its backend");
    // A new flow follows the new slots: every port goes to web now.
    let web = v4(&lab, Peer::Pod(WEB));
    for p in [sport + 1, sport + 2, sport + 3] {
        let (o, out) = lab.from_out(CLIENT, &frame(client, p, VIP, PORT, TCP, SYN));
        expect("a new flow", o, PASS);
        assert_eq!(dst_of(&out).0, web, "port {p}: the new slots");
    }
    // A new connection reusing the old tuple: its backend is gone, so it is placed again.
    let (o, out) = lab.from_out(CLIENT, &frame(client, sport, VIP, PORT, TCP, SYN));
    expect("a new SYN on the old tuple", o, PASS);
    assert_eq!(dst_of(&out).0, web, "a gone backend gets no new connection");
}

/// Flags backend `id` terminating (the agent's entry for a backend that still serves but is no
/// longer ready: no slot, kept in the map).
fn terminate_backend(lab: &mut Lab, id: u32) {
    let mut m: HashMap<_, u32, Backend4> =
        HashMap::try_from(lab.ebpf.map_mut(SVC_BACKENDS4).expect("backends")).expect("hash");
    let mut b = m.get(&id, 0).expect("the backend");
    b.flags |= BACKEND_FLAG_TERMINATING;
    m.insert(&id, &b, 0).expect("flag the backend");
}

#[test]
fn a_terminating_backend_keeps_its_udp_flows_and_gets_no_new_connection() {
    let Some(mut lab) = lab("a_terminating_backend_keeps_its_udp_flows") else {
        return;
    };
    let client = v4(&lab, Peer::Pod(CLIENT));
    let (db, web) = (v4(&lab, Peer::Pod(DB)), v4(&lab, Peer::Pod(WEB)));
    for proto in [UDP, TCP] {
        service(&mut lab, 1, VIP, proto, &[(1, DB), (2, WEB)]);
        let sport = port_to(&lab, DB, VIP, proto, &[DB, WEB]);
        let first = if proto == TCP { SYN } else { 0 };
        let (o, out) = lab.from_out(CLIENT, &frame(client, sport, VIP, PORT, proto, first));
        expect("the flow's first packet", o, PASS);
        assert_eq!(dst_of(&out).0, db, "proto {proto}");

        // db terminates but still serves: out of the slots, flagged in the map.
        service(&mut lab, 1, VIP, proto, &[(2, WEB)]);
        terminate_backend(&mut lab, 1);
        let later = if proto == TCP { ACK | PSH } else { 0 };
        let (o, out) = lab.from_out(CLIENT, &frame(client, sport, VIP, PORT, proto, later));
        expect("the flow's next packet", o, PASS_ESTABLISHED);
        assert_eq!(
            dst_of(&out),
            (db, TARGET),
            "proto {proto}: the flow stays on db"
        );
        let (o, out) = lab.from_out(CLIENT, &frame(client, sport + 1, VIP, PORT, proto, first));
        expect("a new flow", o, PASS);
        assert_eq!(
            dst_of(&out).0,
            web,
            "proto {proto}: a new flow follows the slots"
        );
        if proto == TCP {
            // A new connection on the old tuple goes where new flows go.
            let (o, out) = lab.from_out(CLIENT, &frame(client, sport, VIP, PORT, TCP, SYN));
            expect("a new SYN on the old tuple", o, PASS);
            assert_eq!(
                dst_of(&out).0,
                web,
                "a terminating backend gets no new connection"
            );
        } else {
            // Control: once db is removed, the UDP flow's next datagram is placed again.
            remove_backend(&mut lab, 1);
            let (o, out) = lab.from_out(CLIENT, &frame(client, sport, VIP, PORT, UDP, 0));
            expect("the next datagram, placed again", o, PASS);
            assert_eq!(dst_of(&out).0, web, "a removed backend keeps no UDP flow");
        }
        // The next protocol's `service` writes both backends afresh (unflagged).
    }
}

/// Gives frontend `vip:PORT/proto` `ClientIP` affinity with `timeout` seconds (after `service`,
/// which writes it without).
fn with_affinity(lab: &mut Lab, vip: Ipv4Addr, proto: u8, timeout: u32) {
    let mut m: HashMap<_, Svc4Key, Svc4Value> =
        HashMap::try_from(lab.ebpf.map_mut(SVC4).expect("svc4")).expect("hash");
    let key = Svc4Key {
        addr: vip.octets(),
        port: PORT,
        protocol: proto,
        scope: 0,
    };
    let mut v = m.get(&key, 0).expect("the frontend");
    v.flags |= SVC_FLAG_AFFINITY;
    v.affinity_timeout_secs = timeout;
    m.insert(&key, &v, 0).expect("rewrite the frontend");
}

fn affinity_map(lab: &mut Lab) -> HashMap<&mut aya::maps::MapData, Affinity4Key, Affinity4> {
    HashMap::try_from(lab.ebpf.map_mut(SVC_AFFINITY4).expect("svc_affin4")).expect("lru")
}

#[test]
fn client_ip_affinity_keeps_a_client_on_its_backend_until_the_timeout_or_the_backend_leaves() {
    let Some(mut lab) = lab("client_ip_affinity_keeps_a_client_on_its_backend") else {
        return;
    };
    let client = v4(&lab, Peer::Pod(CLIENT));
    let addr = |lab: &Lab, pod: usize| v4(lab, Peer::Pod(pod));
    let id_of = |pod: usize| if pod == DB { 1 } else { 2 };
    // The client's hash (affinity: its address only) over 2 slots, then over a count whose
    // slot differs, filled so that the first choice keeps its slot and the hash now names the
    // other backend.
    let hash = flow_hash(client.octets(), 0, VIP.octets(), PORT, TCP, true);
    let first_slot = backend_slot(hash, 2).expect("a slot");
    let first = [DB, WEB][usize::from(first_slot)];
    let other = if first == DB { WEB } else { DB };
    let (count, moved_slot) = (3..16u16)
        .find_map(|n| {
            let s = backend_slot(hash, n).expect("a slot");
            (s != first_slot).then_some((n, s))
        })
        .expect("some count moves the hash");
    let grown: Vec<(u32, usize)> = (0..count)
        .map(|i| {
            let pod = if i == first_slot { first } else { other };
            (id_of(pod), pod)
        })
        .collect();

    // A new connection from `sport` after the frontend got `slots`: where it went.
    let connect = |lab: &mut Lab, slots: &[(u32, usize)], sport: u16, what: &str| {
        service(lab, 1, VIP, TCP, slots);
        with_affinity(lab, VIP, TCP, 600);
        let (o, out) = lab.from_out(CLIENT, &frame(client, sport, VIP, PORT, TCP, SYN));
        expect(what, o, PASS);
        dst_of(&out).0
    };
    let key = Affinity4Key {
        service_id: 1,
        client: client.octets(),
    };
    let to = connect(
        &mut lab,
        &[(1, DB), (2, WEB)],
        41_000,
        "the first connection",
    );
    assert_eq!(to, addr(&lab, first), "placed by the client's hash");
    let remembered = affinity_map(&mut lab)
        .get(&key, 0)
        .expect("the choice is remembered");
    assert_eq!(
        (remembered.backend_id, remembered.slot),
        (id_of(first), first_slot)
    );

    // The slots grow: the hash alone now names the other backend, the client stays.
    let to = connect(
        &mut lab,
        &grown,
        41_001,
        "a new connection within the timeout",
    );
    assert_eq!(to, addr(&lab, first), "affinity holds across the change");

    // The timeout passed (the entry aged by hand): the hash places it, on the other backend
    // (the positive control that affinity, not the hash, kept it above).
    let mut aged = affinity_map(&mut lab).get(&key, 0).expect("the entry");
    aged.last_used_ns = 0;
    affinity_map(&mut lab)
        .insert(&key, &aged, 0)
        .expect("age the entry");
    let to = connect(
        &mut lab,
        &grown,
        41_002,
        "a new connection after the timeout",
    );
    assert_eq!(to, addr(&lab, other), "placed again by the hash");
    let now = affinity_map(&mut lab).get(&key, 0).expect("the new choice");
    assert_eq!((now.backend_id, now.slot), (id_of(other), moved_slot));

    // The remembered backend leaves its slot (the first one takes every slot): the entry no
    // longer holds, and the client goes where the slots say.
    let only_first: Vec<(u32, usize)> = (0..count).map(|_| (id_of(first), first)).collect();
    let to = connect(
        &mut lab,
        &only_first,
        41_003,
        "a new connection after its backend left",
    );
    assert_eq!(
        to,
        addr(&lab, first),
        "a backend out of the slots is not kept"
    );
}

/// `svc_members_v1`, read or written by hand.
fn members_map(lab: &mut Lab) -> HashMap<&mut aya::maps::MapData, MemberKey, MemberValue> {
    HashMap::try_from(lab.ebpf.map_mut(SVC_MEMBERS).expect("svc_members")).expect("hash")
}

#[test]
fn client_ip_affinity_follows_its_backend_to_another_slot() {
    let Some(mut lab) = lab("client_ip_affinity_follows_its_backend") else {
        return;
    };
    let client = v4(&lab, Peer::Pod(CLIENT));
    let addr = |lab: &Lab, pod: usize| v4(lab, Peer::Pod(pod));
    let id_of = |pod: usize| if pod == DB { 1 } else { 2 };
    // The client's hash over 2 slots names `first`; swapping the two backends' slots (what an
    // endpoint added before one in address order does to the agent's sorted slots) leaves the
    // hash naming the other one.
    let hash = flow_hash(client.octets(), 0, VIP.octets(), PORT, TCP, true);
    let first_slot = backend_slot(hash, 2).expect("a slot");
    let first = [DB, WEB][usize::from(first_slot)];
    let other = if first == DB { WEB } else { DB };
    let connect = |lab: &mut Lab, slots: &[(u32, usize)], sport: u16, what: &str| {
        service(lab, 1, VIP, TCP, slots);
        with_affinity(lab, VIP, TCP, 600);
        let (o, out) = lab.from_out(CLIENT, &frame(client, sport, VIP, PORT, TCP, SYN));
        expect(what, o, PASS);
        dst_of(&out).0
    };
    let key = Affinity4Key {
        service_id: 1,
        client: client.octets(),
    };
    let placed: Vec<(u32, usize)> = [DB, WEB].iter().map(|p| (id_of(*p), *p)).collect();
    let swapped: Vec<(u32, usize)> = placed.iter().rev().copied().collect();
    let to = connect(&mut lab, &placed, 43_000, "the first connection");
    assert_eq!(to, addr(&lab, first), "placed by the client's hash");

    // The backends swap slots: the client stays on its backend, now remembered at its new slot.
    let to = connect(&mut lab, &swapped, 43_001, "a connection after the swap");
    assert_eq!(to, addr(&lab, first), "affinity follows the backend");
    let now = affinity_map(&mut lab).get(&key, 0).expect("the entry");
    assert_eq!((now.backend_id, now.slot), (id_of(first), 1 - first_slot));
    let member = MemberKey {
        service_id: 1,
        backend_id: id_of(first),
    };
    assert_eq!(
        members_map(&mut lab)
            .get(&member, 0)
            .expect("the member")
            .slot,
        1 - first_slot
    );

    // The control: the entry as it was before the swap (its slot now holds the other backend),
    // and the backend's member entry gone (as if the agent had not written it yet): nothing says
    // where `first` went, and the hash places the client on `other`.
    let mut before = now;
    before.slot = first_slot;
    affinity_map(&mut lab)
        .insert(&key, &before, 0)
        .expect("the entry as before the swap");
    members_map(&mut lab)
        .remove(&member)
        .expect("remove the member");
    let (o, out) = lab.from_out(CLIENT, &frame(client, 43_002, VIP, PORT, TCP, SYN));
    expect("a connection without the member", o, PASS);
    assert_eq!(
        dst_of(&out).0,
        addr(&lab, other),
        "placed again by the hash"
    );

    // A member entry naming a slot its backend does not hold is not believed either.
    let other_member = MemberKey {
        service_id: 1,
        backend_id: id_of(other),
    };
    service(
        &mut lab,
        1,
        VIP,
        TCP,
        &[(id_of(first), first), (id_of(first), first)],
    );
    members_map(&mut lab)
        .insert(
            &other_member,
            &MemberValue {
                slot: 1 - first_slot,
                pad: 0,
            },
            0,
        )
        .expect("a stale member");
    with_affinity(&mut lab, VIP, TCP, 600);
    let (o, out) = lab.from_out(CLIENT, &frame(client, 43_003, VIP, PORT, TCP, SYN));
    expect("a connection with a stale member", o, PASS);
    assert_eq!(
        dst_of(&out).0,
        addr(&lab, first),
        "the slots, not a stale member, decide"
    );
}

#[test]
fn a_tuple_reused_through_another_frontend_gets_replies_from_that_frontend() {
    let Some(mut lab) = lab("a_tuple_reused_through_another_frontend") else {
        return;
    };
    let client = v4(&lab, Peer::Pod(CLIENT));
    let db = v4(&lab, Peer::Pod(DB));
    // Two Services onto the same backend port: one client port through each in turn translates
    // to the same tuple (the kernel reuses a source port for another destination).
    service(&mut lab, 1, VIP, TCP, &[(1, DB)]);
    service(&mut lab, 2, WEB_VIP, TCP, &[(1, DB)]);
    let sport = 42_000;
    for (round, vip) in [VIP, WEB_VIP, VIP].into_iter().enumerate() {
        let (o, out) = lab.from_out(CLIENT, &frame(client, sport, vip, PORT, TCP, SYN));
        assert!(o.passed, "round {round}: the SYN to {vip} passes: {o}");
        assert_eq!(dst_of(&out), (db, TARGET), "round {round}");
        let reply = frame(db, TARGET, client, sport, TCP, SYN | ACK);
        assert!(
            lab.from(DB, &reply).passed,
            "round {round}: the SYN-ACK leaves db"
        );
        let (o, back) = lab.to_out(CLIENT, &reply);
        assert!(
            o.passed,
            "round {round}: the SYN-ACK enters the client: {o}"
        );
        assert_eq!(
            src_of(&back),
            (vip, PORT),
            "round {round}: the reply comes from the frontend this connection dialled"
        );
    }
}

#[test]
fn a_new_flow_meeting_another_frontends_live_tuple_takes_the_next_backend() {
    let Some(mut lab) = lab("a_new_flow_meeting_another_frontends_live_tuple") else {
        return;
    };
    let client = v4(&lab, Peer::Pod(CLIENT));
    let (db, web) = (v4(&lab, Peer::Pod(DB)), v4(&lab, Peer::Pod(WEB)));
    // Two Services onto the same backend port, db behind both, web behind the second too.
    service(&mut lab, 1, VIP, TCP, &[(1, DB)]);
    service(&mut lab, 2, WEB_VIP, TCP, &[(1, DB), (2, WEB)]);
    // Two client ports whose flows through the second frontend the hash sends to db.
    let port = port_to(&lab, DB, WEB_VIP, TCP, &[DB, WEB]);
    let control = (port + 1..41_000)
        .find(|p| chosen(&lab, *p, WEB_VIP, TCP, &[DB, WEB]) == DB)
        .expect("a second port to db");
    // Control: with no other flow on its tuple, such a flow goes to db.
    let (o, out) = lab.from_out(CLIENT, &frame(client, control, WEB_VIP, PORT, TCP, SYN));
    assert!(o.passed, "the control SYN passes: {o}");
    assert_eq!(
        dst_of(&out),
        (db, TARGET),
        "the hash's choice, nothing in the way"
    );

    // A live connection from `port` through the first frontend holds (client:port, db:8080).
    let (o, out) = lab.from_out(CLIENT, &frame(client, port, VIP, PORT, TCP, SYN));
    assert!(o.passed, "the first connection's SYN passes: {o}");
    assert_eq!(dst_of(&out), (db, TARGET));
    assert!(
        lab.from(DB, &frame(db, TARGET, client, port, TCP, SYN | ACK))
            .passed
    );
    // The kernel reuses the port for the second frontend: that flow takes web, not db's tuple.
    let (o, out) = lab.from_out(CLIENT, &frame(client, port, WEB_VIP, PORT, TCP, SYN));
    assert!(o.passed, "the second connection's SYN passes: {o}");
    assert_eq!(
        dst_of(&out),
        (web, TARGET),
        "the second connection does not take the first one's tuple"
    );
    // Each connection's replies come from the frontend it dialled.
    for (pod, from, vip) in [(DB, db, VIP), (WEB, web, WEB_VIP)] {
        let reply = frame(from, TARGET, client, port, TCP, SYN | ACK);
        assert!(lab.from(pod, &reply).passed, "the reply leaves {from}");
        let (o, back) = lab.to_out(CLIENT, &reply);
        assert!(o.passed, "the reply from {from} enters the client: {o}");
        assert_eq!(src_of(&back), (vip, PORT), "the reply from {from}");
    }
}

#[test]
fn egress_policy_judges_the_backend_identity() {
    let Some(mut lab) = Lab::new("egress_policy_judges_the_backend_identity", Fam::V4) else {
        return;
    };
    lab.register(CLIENT, FLAG_ISOLATED_EGRESS);
    lab.register(DB, 0);
    lab.register(WEB, 0);
    let client = v4(&lab, Peer::Pod(CLIENT));
    service(&mut lab, 1, VIP, TCP, &[(1, DB)]);
    service(&mut lab, 2, WEB_VIP, TCP, &[(2, WEB)]);

    // Egress-isolated with no rule: no service is reachable.
    for (vip, sport) in [(VIP, 40_000), (WEB_VIP, 40_001)] {
        let o = lab.from(CLIENT, &frame(client, sport, vip, PORT, TCP, SYN));
        expect("isolated, no rule", o, DROP_POLICY_DENIED);
    }
    assert_eq!(svc_ct_len(&lab), 0, "a denied flow records no backend");

    // Allowed to app=db (pod 1's identity) on the backends' port, not to app=web.
    let allow = PolicyValue::new(VERDICT_ALLOW, 9);
    lab.policy(CLIENT, EGRESS, IDENTITIES[DB], TCP, TARGET, allow);
    let (o, out) = lab.from_out(CLIENT, &frame(client, 40_002, VIP, PORT, TCP, SYN));
    expect("to the db service", o, PASS_POLICY);
    assert_eq!(dst_of(&out), (v4(&lab, Peer::Pod(DB)), TARGET));
    // Rules match the backend's port: app=web on the frontend's port 80 opens nothing.
    lab.policy(CLIENT, EGRESS, IDENTITIES[WEB], TCP, PORT, allow);
    let o = lab.from(CLIENT, &frame(client, 40_003, WEB_VIP, PORT, TCP, SYN));
    expect("to the web service", o, DROP_POLICY_DENIED);
    assert!(
        svc_ct(
            &lab,
            &ct_key(client, 40_003, WEB_VIP, PORT, TCP, DIR_ORIGINAL)
        )
        .is_none(),
        "the denied flow has no entry"
    );
    assert_eq!(svc_ct_len(&lab), 1, "the db flow's original entry");
}

/// The answer a client gets from a frontend without a ready backend: `frame` turned into an ICMP
/// port unreachable from the frontend back to the client, quoting the frame's IPv4 header and
/// first 8 payload bytes, with valid checksums.
fn assert_port_unreachable(what: &str, frame: &[u8], out: &[u8]) {
    assert_eq!(out.len(), 14 + 20 + 8 + 28, "{what}: the answer's length");
    assert_eq!(&out[..6], &frame[6..12], "{what}: to the client's MAC");
    assert_eq!(&out[6..12], &frame[..6], "{what}: from the MAC it sent to");
    assert_eq!(out[14 + 9], 1, "{what}: ICMP");
    assert_eq!(&out[26..30], &frame[30..34], "{what}: from the frontend");
    assert_eq!(&out[30..34], &frame[26..30], "{what}: to the client");
    assert_eq!((out[34], out[35]), (3, 3), "{what}: port unreachable");
    assert_eq!(&out[42..], &frame[14..42], "{what}: quotes the packet");
    csum::assert_valid_icmp(what, out);
}

#[test]
fn no_ready_backend_answers_port_unreachable_under_its_own_reason() {
    let Some(mut lab) = lab("no_ready_backend_answers_port_unreachable_under_its_own_reason")
    else {
        return;
    };
    let client = v4(&lab, Peer::Pod(CLIENT));
    service(&mut lab, 1, VIP, TCP, &[]);
    service(&mut lab, 2, WEB_VIP, UDP, &[]);
    for (what, f) in [
        ("a TCP SYN", frame(client, 40_000, VIP, PORT, TCP, SYN)),
        (
            "a UDP datagram",
            frame(client, 40_001, WEB_VIP, PORT, UDP, 0),
        ),
    ] {
        let (o, action, out) = lab.from_action(CLIENT, &f);
        expect(what, o, DROP_SERVICE_NO_BACKEND);
        assert_eq!(action, TC_ACT_REDIRECT, "{what}: sent back into the pod");
        assert_port_unreachable(what, &f, &out);
    }
    assert_eq!(lab.ct_len(), 0, "nothing recorded");
    assert_eq!(svc_ct_len(&lab), 0);
    // Positive control: with a ready backend the same packet passes, translated.
    service(&mut lab, 1, VIP, TCP, &[(1, DB)]);
    let syn = frame(client, 40_000, VIP, PORT, TCP, SYN);
    let (o, action, out) = lab.from_action(CLIENT, &syn);
    expect("a backend is ready", o, PASS);
    assert_eq!(action, TC_ACT_OK);
    assert_eq!(dst_of(&out), (v4(&lab, Peer::Pod(DB)), TARGET));
}

/// The ICMP port unreachable `from` sends to `to` about `quoted` (a frame: its IPv4 header and
/// first 8 payload bytes are quoted).
fn port_unreachable(from: Ipv4Addr, to: Ipv4Addr, quoted: &[u8]) -> Vec<u8> {
    let mut icmp = tests::packet::icmp(3, 3, [0; 4], &quoted[14..42]);
    let sum = icmp_checksum(&icmp);
    icmp[2..4].copy_from_slice(&sum.to_be_bytes());
    csum::with_ip_checksum(tests::packet::eth(
        tests::packet::ETH_P_IP,
        &tests::packet::ipv4(from.octets(), to.octets(), 1, &icmp),
    ))
}

fn icmp_checksum(data: &[u8]) -> u16 {
    let mut sum = 0u32;
    for c in data.chunks(2) {
        sum += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[test]
fn an_icmp_error_about_a_translated_flow_reaches_the_client_from_the_frontend() {
    let Some(mut lab) =
        lab("an_icmp_error_about_a_translated_flow_reaches_the_client_from_the_frontend")
    else {
        return;
    };
    let client = v4(&lab, Peer::Pod(CLIENT));
    let backend = v4(&lab, Peer::Pod(DB));
    service(&mut lab, 1, VIP, UDP, &[(1, DB)]);
    let (o, out) = lab.from_out(CLIENT, &frame(client, 40_010, VIP, PORT, UDP, 0));
    expect("to the frontend", o, PASS);
    assert_eq!(dst_of(&out), (backend, TARGET));
    // The backend does not listen: its kernel answers the translated datagram.
    let error = port_unreachable(backend, client, &out);
    let (o, back) = lab.to_out(CLIENT, &error);
    expect("the error entering the client", o, PASS_RELATED);
    let outer_src: [u8; 4] = back[26..30].try_into().expect("4 bytes");
    assert_eq!(Ipv4Addr::from(outer_src), VIP, "from the frontend");
    let quoted = &back[42..];
    let q_dst: [u8; 4] = quoted[16..20].try_into().expect("4 bytes");
    assert_eq!(Ipv4Addr::from(q_dst), VIP, "the quoted destination");
    assert_eq!(
        u16::from_be_bytes([quoted[22], quoted[23]]),
        PORT,
        "the quoted destination port"
    );
    csum::assert_valid_icmp("the translated error", &back);
    assert_eq!(
        icmp_checksum(&quoted[..20]),
        0,
        "the quoted header's checksum"
    );
    // Positive control for the lookup: an error about a flow no service translated keeps its
    // addresses (the same error, quoting a packet to the backend the client never sent).
    let plain = port_unreachable(
        backend,
        client,
        &frame(client, 40_011, backend, TARGET, UDP, 0),
    );
    let (_, untouched) = lab.to_out(CLIENT, &plain);
    assert_eq!(
        &untouched[26..30],
        &backend.octets(),
        "not a translated flow"
    );
}
