//! clsact + `cls_bpf` direct-action filters over rtnetlink: weir's filter sits at a fixed
//! priority and handle on the clsact ingress/egress parent, carries the program's name, and is
//! replaced atomically by a `RTM_NEWTFILTER` on the same priority and handle (`cls_bpf` swaps
//! the program under RCU: no packet sees no program). Filters live on the device: nothing to
//! pin, and they go with it.

use std::{io, os::fd::RawFd};

use aya::programs::TcAttachType;
use netlink_packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage,
    NetlinkPayload,
};
use netlink_packet_route::{
    AddressFamily, RouteNetlinkMessage,
    tc::{TcAttribute, TcBpfFlags, TcFilterBpfOption, TcHandle, TcHeader, TcMessage, TcOption},
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

/// The priority of weir's filters (the first a packet meets).
pub const PRIORITY: u16 = 1;
/// The handle of weir's filter at [`PRIORITY`].
pub const HANDLE: u32 = 1;
const ETH_P_ALL: u16 = 0x0003;

/// One `bpf` filter found on a clsact hook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BpfFilter {
    /// Its priority.
    pub priority: u16,
    /// Its handle.
    pub handle: u32,
    /// The program name it was attached under (`TCA_BPF_NAME`).
    pub name: String,
    /// The program it runs.
    pub program_id: u32,
}

impl BpfFilter {
    /// True for weir's filter slot (priority and handle).
    #[must_use]
    pub fn is_weir_slot(&self) -> bool {
        self.priority == PRIORITY && self.handle == HANDLE
    }
}

/// Errors talking to the kernel's traffic control.
#[derive(Debug, thiserror::Error)]
pub enum FilterError {
    /// The netlink socket could not be opened or used.
    #[error("netlink socket: {0}")]
    Socket(#[source] io::Error),
    /// The kernel refused a request.
    #[error("{op} on interface {ifindex}: {source}")]
    Kernel {
        /// What was asked.
        op: &'static str,
        /// The interface.
        ifindex: u32,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },
    /// The kernel's answer could not be parsed.
    #[error("cannot parse a netlink answer to {op}: {reason}")]
    Parse {
        /// What was asked.
        op: &'static str,
        /// Why.
        reason: String,
    },
}

impl FilterError {
    /// The errno of a kernel refusal.
    #[must_use]
    pub fn errno(&self) -> Option<i32> {
        match self {
            Self::Kernel { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

/// The clsact parent of `hook`.
#[must_use]
pub fn parent(hook: TcAttachType) -> TcHandle {
    TcHandle {
        major: u16::MAX,
        minor: match hook {
            TcAttachType::Ingress => TcHandle::MIN_INGRESS,
            TcAttachType::Egress => TcHandle::MIN_EGRESS,
        },
    }
}

/// A route netlink socket for a few requests in a row.
pub struct Tc {
    socket: Socket,
    seq: u32,
}

impl std::fmt::Debug for Tc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tc").field("seq", &self.seq).finish()
    }
}

impl Tc {
    /// Opens a socket in the calling thread's network namespace.
    pub fn open() -> Result<Self, FilterError> {
        let mut socket = Socket::new(NETLINK_ROUTE).map_err(FilterError::Socket)?;
        socket.bind_auto().map_err(FilterError::Socket)?;
        socket
            .connect(&SocketAddr::new(0, 0))
            .map_err(FilterError::Socket)?;
        // Errors carry the kernel's message; acks do not echo the request.
        socket.set_ext_ack(true).map_err(FilterError::Socket)?;
        socket.set_cap_ack(true).map_err(FilterError::Socket)?;
        Ok(Self { socket, seq: 0 })
    }

    /// Adds a clsact qdisc to `ifindex`; one already there is fine.
    pub fn add_clsact(&mut self, ifindex: u32) -> Result<(), FilterError> {
        let mut msg = TcMessage::with_index(index(ifindex));
        msg.header.handle = TcHandle {
            major: u16::MAX,
            minor: 0,
        };
        msg.header.parent = TcHandle::CLSACT;
        msg.attributes.push(TcAttribute::Kind("clsact".into()));
        let request = RouteNetlinkMessage::NewQueueDiscipline(msg);
        match self.request("add clsact", ifindex, request, NLM_F_CREATE | NLM_F_EXCL) {
            Err(e) if e.errno() == Some(libc_eexist()) => Ok(()),
            other => other.map(drop),
        }
    }

    /// Puts program `prog_fd` (named `name`) into weir's filter slot at `hook` of `ifindex`:
    /// created when absent, the program replaced atomically when present.
    pub fn set_filter(
        &mut self,
        ifindex: u32,
        hook: TcAttachType,
        prog_fd: RawFd,
        name: &str,
    ) -> Result<(), FilterError> {
        let fd = u32::try_from(prog_fd).map_err(|_| FilterError::Kernel {
            op: "attach filter",
            ifindex,
            source: io::Error::from(io::ErrorKind::InvalidInput),
        })?;
        let msg = TcMessage::from_parts(
            slot_header(ifindex, hook, HANDLE, PRIORITY),
            vec![
                TcAttribute::Kind("bpf".into()),
                TcAttribute::Options(vec![
                    TcOption::Bpf(TcFilterBpfOption::ProgFd(fd)),
                    TcOption::Bpf(TcFilterBpfOption::ProgName(name.to_owned())),
                    TcOption::Bpf(TcFilterBpfOption::Flags(TcBpfFlags::DirectAction)),
                ]),
            ],
        );
        // CREATE without EXCL: create, or change the existing filter in place.
        self.request(
            "attach filter",
            ifindex,
            RouteNetlinkMessage::NewTrafficFilter(msg),
            NLM_F_CREATE,
        )
        .map(drop)
    }

    /// Deletes the filter at `priority`/`handle` of `hook` on `ifindex`.
    pub fn delete_filter(
        &mut self,
        ifindex: u32,
        hook: TcAttachType,
        priority: u16,
        handle: u32,
    ) -> Result<(), FilterError> {
        let msg = TcMessage::from_parts(slot_header(ifindex, hook, handle, priority), Vec::new());
        self.request(
            "delete filter",
            ifindex,
            RouteNetlinkMessage::DelTrafficFilter(msg),
            0,
        )
        .map(drop)
    }

    /// Every `bpf` filter at `hook` of `ifindex` (none when there is no clsact qdisc).
    pub fn bpf_filters(
        &mut self,
        ifindex: u32,
        hook: TcAttachType,
    ) -> Result<Vec<BpfFilter>, FilterError> {
        let mut msg = TcMessage::with_index(index(ifindex));
        msg.header.parent = parent(hook);
        let answers = match self.request(
            "list filters",
            ifindex,
            RouteNetlinkMessage::GetTrafficFilter(msg),
            NLM_F_DUMP,
        ) {
            Ok(answers) => answers,
            // No clsact qdisc: no filters.
            Err(e) if e.errno() == Some(nix::errno::Errno::EINVAL as i32) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        Ok(answers.iter().filter_map(parse_bpf_filter).collect())
    }

    fn request(
        &mut self,
        op: &'static str,
        ifindex: u32,
        message: RouteNetlinkMessage,
        flags: u16,
    ) -> Result<Vec<TcMessage>, FilterError> {
        self.seq = self.seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
        header.sequence_number = self.seq;
        let mut packet = NetlinkMessage::new(header, NetlinkPayload::from(message));
        packet.finalize();
        let mut buf = vec![0; packet.buffer_len()];
        packet.serialize(&mut buf);
        self.socket.send(&buf, 0).map_err(FilterError::Socket)?;
        let mut answers = Vec::new();
        loop {
            let (data, _) = self.socket.recv_from_full().map_err(FilterError::Socket)?;
            let mut offset = 0;
            while offset < data.len() {
                let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&data[offset..])
                    .map_err(|e| FilterError::Parse {
                        op,
                        reason: e.to_string(),
                    })?;
                let len = usize::try_from(msg.header.length).unwrap_or(usize::MAX);
                if len == 0 {
                    return Err(FilterError::Parse {
                        op,
                        reason: "zero-length message".into(),
                    });
                }
                offset = offset.saturating_add(len.next_multiple_of(4));
                if msg.header.sequence_number != self.seq {
                    continue;
                }
                match msg.payload {
                    NetlinkPayload::Error(e) => {
                        return match e.code {
                            None => Ok(answers),
                            Some(code) => Err(FilterError::Kernel {
                                op,
                                ifindex,
                                source: io::Error::from_raw_os_error(-code.get()),
                            }),
                        };
                    }
                    NetlinkPayload::Done(_) => return Ok(answers),
                    NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewTrafficFilter(tc)) => {
                        answers.push(tc);
                    }
                    _ => {}
                }
            }
        }
    }
}

fn libc_eexist() -> i32 {
    nix::errno::Errno::EEXIST as i32
}

fn index(ifindex: u32) -> i32 {
    i32::try_from(ifindex).unwrap_or(i32::MAX)
}

fn slot_header(ifindex: u32, hook: TcAttachType, handle: u32, priority: u16) -> TcHeader {
    TcHeader {
        family: AddressFamily::Unspec,
        index: index(ifindex),
        handle: TcHandle::from(handle),
        parent: parent(hook),
        info: (u32::from(priority) << 16) | u32::from(ETH_P_ALL.to_be()),
    }
}

fn parse_bpf_filter(msg: &TcMessage) -> Option<BpfFilter> {
    let kind_is_bpf = msg
        .attributes
        .iter()
        .any(|a| matches!(a, TcAttribute::Kind(k) if k == "bpf"));
    if !kind_is_bpf || u32::from(msg.header.handle) == 0 {
        // The chain's head entry (handle 0) names the priority only.
        return None;
    }
    let (mut name, mut program_id) = (None, None);
    for attr in &msg.attributes {
        if let TcAttribute::Options(options) = attr {
            for option in options {
                match option {
                    TcOption::Bpf(TcFilterBpfOption::ProgName(n)) => name = Some(n.clone()),
                    TcOption::Bpf(TcFilterBpfOption::ProgId(id)) => program_id = Some(*id),
                    _ => {}
                }
            }
        }
    }
    Some(BpfFilter {
        priority: u16::try_from(msg.header.info >> 16).unwrap_or(u16::MAX),
        handle: msg.header.handle.into(),
        name: name.unwrap_or_default(),
        program_id: program_id?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slot_header_encodes_priority_protocol_and_parent() {
        let h = slot_header(7, TcAttachType::Egress, HANDLE, PRIORITY);
        assert_eq!(u32::from(h.parent), 0xffff_fff3);
        assert_eq!(h.info, (1 << 16) | 0x0300);
        assert_eq!(u32::from(h.handle), 1);
        assert_eq!(u32::from(parent(TcAttachType::Ingress)), 0xffff_fff2);
    }
}
