//! `weir policy list|get` (rule hits) and the kernel half of `weir policy trace`'s output.

use std::path::Path;

use anyhow::{Result, bail};
use weir_api::{Client, RuleHitsView, TraceResult};

use super::agent_client::{print_json, runtime};

/// Prints every rule (or one policy's) with its hits.
pub fn rules(socket: &Path, policy: Option<&str>, json: bool) -> Result<()> {
    let client = Client::new(socket, std::time::Duration::from_secs(120));
    let all: Vec<RuleHitsView> =
        runtime()?.block_on(client.get("/v1/policy/rules", "the policy rules"))?;
    let rules: Vec<RuleHitsView> = all
        .into_iter()
        .filter(|r| policy.is_none_or(|p| r.policy == p))
        .collect();
    if let Some(p) = policy
        && rules.is_empty()
    {
        bail!(
            "no policy {p} has compiled rules on this node (weir policy list shows those that do)"
        );
    }
    if json {
        return print_json(&rules);
    }
    println!(
        "{:<40} {:<8} {:>5} {:>7} {:>12} {:>14}",
        "POLICY", "DIR", "RULE", "ID", "PACKETS", "BYTES"
    );
    for r in &rules {
        let policy = if r.policy.is_empty() {
            "(rule ids beyond the counters or no longer known)"
        } else {
            &r.policy
        };
        println!(
            "{:<40} {:<8} {:>5} {:>7} {:>12} {:>14}",
            policy, r.direction, r.index, r.rule_id, r.packets, r.bytes
        );
    }
    println!(
        "hits count the packets a rule decided: a new flow's first packet on the isolated side and stateless packets; established packets conntrack passes are not counted"
    );
    Ok(())
}

/// Prints the loaded programs' answer beside the user-space explanation.
pub fn print_kernel(result: &TraceResult) {
    match (&result.kernel, &result.kernel_error) {
        (Some(k), _) => {
            println!(
                "kernel (the loaded programs, BPF_PROG_TEST_RUN, source port {}):",
                k.src_port
            );
            if k.steps.is_empty() {
                println!(
                    "  neither address is a local endpoint: no weir program on this node sees the packet"
                );
            }
            for s in &k.steps {
                let rule = s
                    .rule
                    .as_deref()
                    .map_or_else(String::new, |r| format!(", rule {r}"));
                println!(
                    "  {:<5} {} on {}: {}{rule}",
                    s.verdict, s.program, s.interface, s.reason
                );
            }
            println!("verdict: {}", k.verdict);
            if let Some(d) = &k.disagreement {
                println!("DISAGREE: {d}");
            }
        }
        (None, Some(e)) => println!("kernel trace unavailable: {e}"),
        (None, None) => {}
    }
}
