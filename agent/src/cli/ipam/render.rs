//! Printing `weir ipam` results as tables or JSON.

use ipam::{
    AssignResult,
    allocator::{AddressInfo, BlockSummary, CheckReport, ReleaseReport, Utilization},
    model::{IpPool, IpamConfig},
};
use serde::Serialize;

use super::Output;

fn json<T: Serialize + ?Sized>(v: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// Prints rows as left-aligned columns under a header.
fn table(header: &[&str], rows: &[Vec<String>]) {
    let mut w: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if let Some(x) = w.get_mut(i) {
                *x = (*x).max(c.len());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let s: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<width$}", width = w[i]))
            .collect();
        println!("{}", s.join("  ").trim_end());
    };
    line(header.to_vec());
    for r in rows {
        line(r.iter().map(String::as_str).collect());
    }
}

pub(super) fn message(out: Output, msg: &str) -> anyhow::Result<()> {
    match out {
        Output::Json => json(&serde_json::json!({ "message": msg })),
        Output::Text => {
            println!("{msg}");
            Ok(())
        }
    }
}

pub(super) fn pools(out: Output, pools: &[IpPool]) -> anyhow::Result<()> {
    if out == Output::Json {
        return json(pools);
    }
    let rows: Vec<Vec<String>> = pools
        .iter()
        .map(|p| {
            let uses: Vec<String> = p.allowed_uses.iter().map(ToString::to_string).collect();
            vec![
                p.name.clone(),
                p.cidr.to_string(),
                format!("/{}", p.block_size),
                if p.node_selector.is_empty() {
                    "all()".into()
                } else {
                    p.node_selector.clone()
                },
                uses.join(","),
                if p.disabled {
                    "yes".into()
                } else {
                    "no".into()
                },
            ]
        })
        .collect();
    table(
        &["NAME", "CIDR", "BLOCK", "NODE SELECTOR", "USES", "DISABLED"],
        &rows,
    );
    Ok(())
}

pub(super) fn config(out: Output, c: &IpamConfig) -> anyhow::Result<()> {
    if out == Output::Json {
        return json(c);
    }
    table(
        &[
            "STRICT AFFINITY",
            "AUTO ALLOCATE BLOCKS",
            "MAX BLOCKS PER HOST",
            "COOLDOWN",
        ],
        &[vec![
            c.strict_affinity.to_string(),
            c.auto_allocate_blocks.to_string(),
            c.max_blocks_per_host.to_string(),
            format!("{}s", c.ip_cooldown_seconds),
        ]],
    );
    Ok(())
}

pub(super) fn assigned(out: Output, handle: &str, r: &AssignResult) -> anyhow::Result<()> {
    if out == Output::Json {
        return json(
            &serde_json::json!({ "handle": handle, "ipv4": r.ipv4, "ipv6": r.ipv6, "messages": r.messages }),
        );
    }
    for n in r.ipv4.iter().chain(&r.ipv6) {
        println!("{n}");
    }
    for m in &r.messages {
        eprintln!("note: {m}");
    }
    Ok(())
}

pub(super) fn released(out: Output, r: &ReleaseReport) -> anyhow::Result<()> {
    if out == Output::Json {
        let released: Vec<_> = r
            .released
            .iter()
            .map(|(ip, h)| serde_json::json!({ "ip": ip, "handle": h }))
            .collect();
        return json(&serde_json::json!({ "released": released, "notAllocated": r.not_allocated }));
    }
    for (ip, h) in &r.released {
        println!(
            "released {ip}{}",
            h.as_ref()
                .map(|h| format!(" (handle {h})"))
                .unwrap_or_default()
        );
    }
    for ip in &r.not_allocated {
        println!("{ip} was not allocated");
    }
    Ok(())
}

pub(super) fn released_handle(
    out: Output,
    handle: &str,
    ips: &[std::net::IpAddr],
) -> anyhow::Result<()> {
    if out == Output::Json {
        return json(&serde_json::json!({ "handle": handle, "released": ips }));
    }
    if ips.is_empty() {
        println!("handle {handle} held no addresses");
    }
    for ip in ips {
        println!("released {ip} (handle {handle})");
    }
    Ok(())
}

pub(super) fn address(out: Output, a: &AddressInfo) -> anyhow::Result<()> {
    if out == Output::Json {
        return json(a);
    }
    let opt = |o: Option<String>| o.unwrap_or_else(|| "-".into());
    table(
        &[
            "IP", "STATE", "POOL", "BLOCK", "AFFINITY", "HANDLE", "SEQUENCE",
        ],
        &[vec![
            a.ip.to_string(),
            a.state.clone(),
            opt(a.pool.clone()),
            opt(a.block.map(|b| b.to_string())),
            opt(a.block_affinity.clone()),
            opt(a.handle.clone()),
            opt(a.sequence_number.map(|s| s.to_string())),
        ]],
    );
    Ok(())
}

fn util_rows(u: &[Utilization]) -> Vec<Vec<String>> {
    u.iter()
        .map(|u| {
            vec![
                u.pool.clone(),
                u.cidr.to_string(),
                u.capacity.to_string(),
                u.in_use.to_string(),
                u.reserved.to_string(),
                u.available.to_string(),
            ]
        })
        .collect()
}

pub(super) fn utilization(out: Output, u: &[Utilization]) -> anyhow::Result<()> {
    if out == Output::Json {
        return json(u);
    }
    let mut rows = util_rows(u);
    for p in u {
        rows.extend(util_rows(&p.blocks).into_iter().map(|mut r| {
            r[0] = format!("  {} block", r[0]);
            r
        }));
    }
    table(
        &[
            "POOL",
            "CIDR",
            "CAPACITY",
            "IN USE",
            "RESERVED",
            "AVAILABLE",
        ],
        &rows,
    );
    Ok(())
}

pub(super) fn show(
    out: Output,
    u: &[Utilization],
    blocks: Option<&[BlockSummary]>,
) -> anyhow::Result<()> {
    if out == Output::Json {
        return json(&serde_json::json!({ "pools": u, "blocks": blocks }));
    }
    table(
        &[
            "POOL",
            "CIDR",
            "CAPACITY",
            "IN USE",
            "RESERVED",
            "AVAILABLE",
        ],
        &util_rows(u),
    );
    if let Some(blocks) = blocks {
        println!();
        let rows: Vec<Vec<String>> = blocks
            .iter()
            .map(|b| {
                vec![
                    b.cidr.to_string(),
                    b.affinity.clone().unwrap_or_else(|| "-".into()),
                    b.in_use.to_string(),
                    b.free.to_string(),
                ]
            })
            .collect();
        table(&["BLOCK", "AFFINITY", "IN USE", "FREE"], &rows);
    }
    Ok(())
}

pub(super) fn check(out: Output, r: &CheckReport) -> anyhow::Result<()> {
    if out == Output::Json {
        return json(r);
    }
    println!(
        "checked {} blocks, {} allocations, {} handles, {} affinities: {} problem(s), {} leak(s)",
        r.blocks,
        r.allocations,
        r.handles,
        r.affinities,
        r.problems.len(),
        r.leaks.len()
    );
    for p in &r.problems {
        println!("problem: {p}");
    }
    for l in &r.leaks {
        println!("leak: {l}");
    }
    Ok(())
}

pub(super) fn node_released(out: Output, r: &ipam::allocator::NodeRelease) -> anyhow::Result<()> {
    if out == Output::Json {
        return json(r);
    }
    let blocks: Vec<String> = r.blocks.iter().map(ToString::to_string).collect();
    println!(
        "released node {}: {} block(s) ({}), {} address(es){}",
        r.node,
        r.blocks.len(),
        if blocks.is_empty() {
            "none".to_owned()
        } else {
            blocks.join(", ")
        },
        r.addresses,
        if r.record_deleted {
            "; its node record is deleted"
        } else {
            ""
        }
    );
    Ok(())
}
