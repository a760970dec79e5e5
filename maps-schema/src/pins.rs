//! The pin layout under a pin root, shared by the agent and `weir-cni` (which attach to the same
//! links): `maps/<name>_v<N>`, `progs/<program>`, `links/<ifname>:<program>`. bpffs refuses names
//! with a dot, so a dot in an interface name (a VLAN such as `eth0.100`) is written as `:`, which
//! no interface name contains.

/// Directory of pinned maps.
pub const MAPS_DIR: &str = "maps";
/// Directory of pinned programs.
pub const PROGS_DIR: &str = "progs";
/// Directory of pinned links.
pub const LINKS_DIR: &str = "links";

/// File name of the pin of the link attaching `program` to `ifname`.
#[cfg(feature = "user")]
#[must_use]
pub fn link_pin_name(ifname: &str, program: &str) -> std::string::String {
    std::format!("{}:{program}", ifname.replace('.', ":"))
}

/// The (interface, program) a link pin file name stands for (inverse of [`link_pin_name`]).
#[cfg(feature = "user")]
#[must_use]
pub fn parse_link_pin_name(name: &str) -> Option<(std::string::String, std::string::String)> {
    use std::borrow::ToOwned as _;
    let (ifname, program) = name.rsplit_once(':')?;
    (!ifname.is_empty() && !program.is_empty())
        .then(|| (ifname.replace(':', "."), program.to_owned()))
}

#[cfg(all(test, feature = "user"))]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        assert_eq!(
            link_pin_name("eth0.100", "xdp_prefilter"),
            "eth0:100:xdp_prefilter"
        );
        assert_eq!(
            parse_link_pin_name("eth0:100:xdp_prefilter"),
            Some(("eth0.100".into(), "xdp_prefilter".into()))
        );
        assert_eq!(parse_link_pin_name("nocolon"), None);
    }
}
