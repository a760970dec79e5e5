//! `weir policy trace` through the kernel: the synthetic packet runs through the *loaded* programs
//! (`progs/from_endpoint` on the source endpoint's veth, then `progs/to_endpoint` on the
//! destination's) with `BPF_PROG_TEST_RUN`, against the live pinned maps. The run is a trace run
//! (`maps_schema::trace`): the programs read conntrack, endpoints, identities and policy as real
//! packets do, but write nothing, and answer the reason and deciding rule in the context's `cb[]`.

use std::net::IpAddr;

use maps_schema::{
    reason::{self, is_pass},
    trace::{CB_DONE, CB_MAGIC},
};

use super::packet::{self, Spec};
use crate::{
    control::node::Node,
    kernel::{TraceIo, TraceIoError},
    observe::trace::{TraceRequest, TraceResult},
    sources::registry::Endpoint,
};

/// Size of the kernel's `struct __sk_buff` and the offsets of the fields a trace run sets.
const SK_BUFF_SIZE: usize = 192;
const SK_BUFF_IFINDEX: usize = 40;
const SK_BUFF_CB: usize = 48;

/// Source port of the synthetic packet when the request names none.
pub const DEFAULT_SRC_PORT: u16 = 40_000;

/// Why the kernel trace could not run.
#[derive(Debug, thiserror::Error)]
pub enum KtraceError {
    /// The kernel could not run the trace.
    #[error(transparent)]
    Kernel(#[from] TraceIoError),
    /// An endpoint's host interface is gone.
    #[error("endpoint {endpoint}'s host interface cannot be found: {source}")]
    Ifindex {
        /// Endpoint key.
        endpoint: String,
        /// Cause.
        #[source]
        source: TraceIoError,
    },
    /// The program ran but did not answer as a trace run.
    #[error(
        "{program} did not answer the trace run (a program without trace support is loaded): restart the agent with this release's object"
    )]
    NoAnswer {
        /// Program.
        program: &'static str,
    },
    /// Mixed address families.
    #[error("source and destination must be of the same address family")]
    Family,
    /// `from_endpoint` names no endpoint.
    #[error("no endpoint {0:?} (give a container id, a host interface or namespace/pod)")]
    NoSuchEndpoint(String),
    /// Bad TCP flags.
    #[error("tcp flags {0:?} are not syn, ack, syn-ack, fin-ack, rst or a number")]
    TcpFlags(String),
}

/// One program's answer, and what the loaded programs answered (the API contract's).
pub use weir_api::{KernelStep, KernelTrace};

/// Runs `program` on `frame` as a trace run on `ifindex`: (reason, rule id).
fn run(
    kernel: &dyn TraceIo,
    program: &'static str,
    ifindex: u32,
    nonce: u64,
    frame: &[u8],
) -> Result<(u32, u32), KtraceError> {
    let mut ctx = [0u8; SK_BUFF_SIZE];
    ctx[SK_BUFF_IFINDEX..SK_BUFF_IFINDEX + 4].copy_from_slice(&ifindex.to_ne_bytes());
    let words = [CB_MAGIC, (nonce & 0xffff_ffff) as u32, (nonce >> 32) as u32];
    for (i, w) in words.iter().enumerate() {
        let at = SK_BUFF_CB + 4 * i;
        ctx[at..at + 4].copy_from_slice(&w.to_ne_bytes());
    }
    let out = kernel.test_run(program, frame, &ctx)?;
    let word = |i: usize| {
        let at = SK_BUFF_CB + 4 * i;
        out.get(at..at + 4)
            .map_or(0, |w| u32::from_ne_bytes([w[0], w[1], w[2], w[3]]))
    };
    if word(0) != CB_DONE {
        return Err(KtraceError::NoAnswer { program });
    }
    Ok((word(1), word(2)))
}

fn find_source<'a>(
    node: &'a Node,
    req: &TraceRequest,
) -> Result<Option<&'a Endpoint>, KtraceError> {
    match &req.from_endpoint {
        Some(name) => node
            .endpoints()
            .find(|e| {
                e.key() == *name
                    || e.host_ifname == *name
                    || e.container_id == *name
                    || format!("{}/{}", e.namespace, e.pod) == *name
            })
            .map(Some)
            .ok_or_else(|| KtraceError::NoSuchEndpoint(name.clone())),
        None => Ok(node.endpoints().find(|e| e.ips.contains(&req.src))),
    }
}

fn ifindex(kernel: &dyn TraceIo, e: &Endpoint) -> Result<u32, KtraceError> {
    kernel
        .ifindex(&e.host_ifname)
        .map_err(|source| KtraceError::Ifindex {
            endpoint: e.key(),
            source,
        })
}

/// Traces `req` through the loaded programs; `user_verdict` is the user-space explanation's.
pub fn trace(
    kernel: &dyn TraceIo,
    node: &Node,
    req: &TraceRequest,
    proto: u8,
    user_verdict: &str,
) -> Result<KernelTrace, KtraceError> {
    if matches!(
        (req.src, req.dst),
        (IpAddr::V4(_), IpAddr::V6(_)) | (IpAddr::V6(_), IpAddr::V4(_))
    ) {
        return Err(KtraceError::Family);
    }
    let tcp_flags = match &req.tcp_flags {
        None => packet::TCP_SYN,
        Some(f) => packet::tcp_flags(f).ok_or_else(|| KtraceError::TcpFlags(f.clone()))?,
    };
    let src_port = req.src_port.unwrap_or(DEFAULT_SRC_PORT);
    let spec = Spec {
        src: req.src,
        dst: req.dst,
        proto,
        src_port,
        port: req.port,
        tcp_flags,
    };
    let frame = packet::frame(&spec).ok_or(KtraceError::Family)?;
    let nonce = kernel.trace_nonce()?;
    let source = find_source(node, req)?;
    let destination = node.endpoints().find(|e| e.ips.contains(&req.dst));
    let mut steps = Vec::new();
    for (program, endpoint) in [("from_endpoint", source), ("to_endpoint", destination)] {
        let Some(endpoint) = endpoint else { continue };
        let (code, rule_id) = run(kernel, program, ifindex(kernel, endpoint)?, nonce, &frame)?;
        let rule = (rule_id != 0).then(|| {
            node.rule(rule_id).map_or_else(
                || format!("rule {rule_id} (no longer known)"),
                |r| format!("{} {}[{}]", r.policy, r.direction, r.index),
            )
        });
        let pass = is_pass(code);
        steps.push(KernelStep {
            program: program.to_owned(),
            interface: format!(
                "{} ({}/{})",
                endpoint.host_ifname, endpoint.namespace, endpoint.pod
            ),
            verdict: if pass { "allow" } else { "deny" }.to_owned(),
            reason: reason::name(code).to_owned(),
            rule_id,
            rule,
        });
        if !pass {
            break;
        }
    }
    let verdict = if steps.iter().all(|s| s.verdict == "allow") {
        "allow"
    } else {
        "deny"
    };
    let agrees = verdict == user_verdict;
    let disagreement = (!agrees).then(|| {
        let decider = steps
            .iter()
            .find(|s| s.verdict == "deny")
            .or_else(|| steps.iter().find(|s| s.reason != "pass-policy" && s.reason != "pass"))
            .map_or_else(String::new, |s| format!(" ({} on {}: {})", s.program, s.interface, s.reason));
        format!(
            "the loaded programs say {verdict}{decider} but the user-space explanation says {user_verdict}: it models policy only, not conntrack (established replies), anti-spoofing, parsing or a state not yet applied"
        )
    });
    Ok(KernelTrace {
        src_port,
        steps,
        verdict: verdict.to_owned(),
        agrees,
        disagreement,
    })
}

/// Runs the kernel trace beside the user-space one; a failure is reported in the answer.
pub fn add_kernel_trace(
    kernel: &dyn TraceIo,
    node: &Node,
    req: &TraceRequest,
    proto: u8,
    result: &mut TraceResult,
) {
    match trace(kernel, node, req, proto, &result.verdict) {
        Ok(k) => result.kernel = Some(k),
        Err(e) => result.kernel_error = Some(e.to_string()),
    }
}
