//! `weir agent` for real: it mounts/uses bpffs, pins its maps and programs under its own root,
//! attaches the prefilter only where it is told to, exits cleanly on SIGTERM leaving pins and
//! attachments in place, and reuses its pinned maps on restart.

use tests::{
    agent_proc::{AgentDirs, AgentProcess},
    bpf::{PinRoot, bpftool},
    netns::{NetNs, VethPair},
    privileged::require_root,
};

fn xdp_prog_id(ns: &NetNs, ifname: &str) -> Option<u64> {
    let out = ns.exec(&["ip", "-j", "-d", "link", "show", "dev", ifname]);
    let links: serde_json::Value = serde_json::from_slice(&out.stdout).expect("ip -j prints JSON");
    links[0]["xdp"]["prog"]["id"].as_u64()
}

/// Program ids as bpftool reads them from the pins.
/// Every map of `maps_schema` with the kernel id of its pin (bpftool).
fn map_ids(root: &PinRoot) -> Vec<(&'static str, u64)> {
    let paths = root.paths();
    maps_schema::maps::ALL
        .iter()
        .map(|name| {
            let shown = bpftool(&[
                "map",
                "show",
                "pinned",
                &paths.map_pin(name).display().to_string(),
            ]);
            (*name, shown["id"].as_u64().expect("map id"))
        })
        .collect()
}

fn agent_programs(root: &PinRoot) -> Vec<u64> {
    let paths = root.paths();
    maps_schema::programs::ALL
        .iter()
        .map(|name| {
            let shown = bpftool(&[
                "prog",
                "show",
                "pinned",
                &paths.prog_pin(name).display().to_string(),
            ]);
            shown["id"].as_u64().expect("program id")
        })
        .collect()
}

#[test]
fn agent_loads_pins_and_survives_restart() {
    if !require_root("agent_loads_pins_and_survives_restart") {
        return;
    }
    let root = PinRoot::new();
    let dirs = AgentDirs::new();
    let node = NetNs::new();
    let other = NetNs::new();
    let told = VethPair::new(&node, "x", &other, "y");
    let untouched = VethPair::new(&node, "u", &other, "v");
    let paths = root.paths();

    let agent = AgentProcess::start(
        &root,
        &dirs,
        Some(&node),
        &["--prefilter-interfaces", &told.a],
    );
    assert_eq!(
        agent.map_ids().len(),
        maps_schema::maps::ALL.len(),
        "every map is reported"
    );
    // The ids a restart must keep, read from the pins with bpftool (not from the agent's report).
    let first_maps = map_ids(&root);
    for name in maps_schema::maps::ALL {
        let shown = bpftool(&[
            "map",
            "show",
            "pinned",
            &paths.map_pin(name).display().to_string(),
        ]);
        assert_eq!(
            shown["name"], *name,
            "bpftool finds {name} at its versioned pin"
        );
    }
    for name in maps_schema::programs::ALL {
        let shown = bpftool(&[
            "prog",
            "show",
            "pinned",
            &paths.prog_pin(name).display().to_string(),
        ]);
        assert_eq!(shown["name"], *name);
    }
    let xdp_on_told =
        xdp_prog_id(&node, &told.a).expect("xdp_prefilter is attached where the operator said");
    assert_eq!(
        xdp_prog_id(&node, &untouched.a),
        None,
        "no program on an interface the agent was not told about"
    );

    let status = agent.terminate();
    assert!(
        status.success(),
        "weir agent exits cleanly on SIGTERM: {status}"
    );
    // Pins and the attachment outlive the agent.
    for name in maps_schema::maps::ALL {
        assert!(paths.map_pin(name).exists(), "{name} stays pinned");
    }
    assert_eq!(
        xdp_prog_id(&node, &told.a),
        Some(xdp_on_told),
        "the prefilter stays attached"
    );

    // Restart over an unchanged object: the pinned maps and programs are reused (same kernel ids)
    // and the prefilter link is left as it is.
    let first_programs = agent_programs(&root);
    let agent = AgentProcess::start(
        &root,
        &dirs,
        Some(&node),
        &["--prefilter-interfaces", &told.a],
    );
    assert_eq!(
        map_ids(&root),
        first_maps,
        "a restart reuses the pinned maps"
    );
    assert_eq!(
        agent_programs(&root),
        first_programs,
        "a restart reuses the pinned programs"
    );
    assert_eq!(
        xdp_prog_id(&node, &told.a),
        Some(xdp_on_told),
        "the prefilter link is untouched"
    );
    assert_eq!(agent.started["prefilter"][0][1], "unchanged");
    assert!(agent.terminate().success());
}

/// A map the agent fills, pinned at a layout version other than the object's (left by another
/// release), is removed once the agent is in sync; conntrack pins are left to the migration and
/// unrelated pins are not touched.
#[test]
fn pins_of_other_layout_versions_of_agent_maps_are_removed() {
    if !require_root("pins_of_other_layout_versions_of_agent_maps_are_removed") {
        return;
    }
    let root = PinRoot::new();
    let dirs = AgentDirs::new();
    let node = NetNs::new();
    let paths = root.with_maps_dir();
    let pin = |name: &str| {
        let map = aya::maps::HashMap::<_, u32, u32>::create(16, 0).expect("create a map");
        map.pin(paths.map_pin(name)).expect("pin");
    };
    pin("policy_v0");
    pin("wt_unrelated_v1");
    let agent = AgentProcess::start(&root, &dirs, Some(&node), &[]);
    assert!(
        !paths.map_pin("policy_v0").exists(),
        "the other layout's policy pin is removed"
    );
    assert!(paths.map_pin("policy_v1").exists(), "the agent's own stays");
    assert!(
        paths.map_pin("wt_unrelated_v1").exists(),
        "a pin the agent does not own is left alone"
    );
    assert!(agent.terminate().success());
}
