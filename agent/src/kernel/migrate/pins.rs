//! What the conntrack pins in the maps directory say about a migration (pure: names in, plan
//! out), so every crash state is unit-tested without a kernel.
//!
//! Pin names: `ct4_v2` (in use or ready), `ct4_v2:migrating` (a copy in progress: discarded),
//! `ct4_v2_old` (a resize's source), `ct4_v2:rollback` (prepared by `weir bpf migrate
//! --to-version`: the newer map the older agent copies the last entries from).

use std::fmt;

/// One conntrack pin, parsed.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct CtPin {
    /// Layout version.
    pub version: u32,
    /// Its role.
    pub kind: PinKind,
}

/// The role a pin's suffix gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum PinKind {
    /// `ct4_vN`.
    Plain,
    /// `ct4_vN_old`: the source of a resize.
    Old,
    /// `ct4_vN:migrating`: an unfinished copy.
    Migrating,
    /// `ct4_vN:rollback`: the newer map after `weir bpf migrate --to-version`.
    Rollback,
}

impl CtPin {
    /// Parses `name` if it is a pin of the map family `stem` (`ct4`).
    #[must_use]
    pub fn parse(stem: &str, name: &str) -> Option<Self> {
        let rest = name.strip_prefix(stem)?.strip_prefix("_v")?;
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let version = rest[..digits].parse().ok()?;
        let kind = match &rest[digits..] {
            "" => PinKind::Plain,
            "_old" => PinKind::Old,
            ":migrating" => PinKind::Migrating,
            ":rollback" => PinKind::Rollback,
            _ => return None,
        };
        Some(Self { version, kind })
    }

    /// The pin's file name for family `stem`.
    #[must_use]
    pub fn name(&self, stem: &str) -> String {
        let suffix = match self.kind {
            PinKind::Plain => "",
            PinKind::Old => "_old",
            PinKind::Migrating => ":migrating",
            PinKind::Rollback => ":rollback",
        };
        format!("{stem}_v{}{suffix}", self.version)
    }

    /// A plain pin of `version`.
    #[must_use]
    pub const fn plain(version: u32) -> Self {
        Self {
            version,
            kind: PinKind::Plain,
        }
    }
}

/// What the agent of layout `target` must do for one family before it loads its programs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Unfinished copies to discard.
    pub discard: Vec<CtPin>,
    /// `ct4_vN:rollback` of the agent's own layout: an abandoned rollback, renamed back.
    pub restore: Option<CtPin>,
    /// The target exists and is in use.
    pub target_exists: bool,
    /// Sources to copy from: the first is the full copy's source when the target is missing;
    /// every one is merged (the delta) after the links run the new programs, then removed.
    pub sources: Vec<CtPin>,
}

/// Why an agent must not touch the pins.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// A newer layout is in use: only the newer release can convert it back.
    Newer {
        /// The pin found.
        pin: CtPin,
    },
    /// A layout this release cannot convert.
    Unknown {
        /// The pin found.
        pin: CtPin,
    },
}

impl fmt::Display for CtPin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.name("ct"))
    }
}

/// Plans family `stem` for an agent of layout `target` that converts layouts `known`.
pub fn plan(pins: &[CtPin], target: u32, known: impl Fn(u32) -> bool) -> Result<Plan, Refusal> {
    let mut plan = Plan::default();
    let mut sources = Vec::new();
    for pin in pins {
        match pin.kind {
            PinKind::Migrating => plan.discard.push(pin.clone()),
            PinKind::Plain | PinKind::Old if pin.version > target => {
                return Err(Refusal::Newer { pin: pin.clone() });
            }
            PinKind::Plain if pin.version == target => plan.target_exists = true,
            PinKind::Rollback if pin.version == target => plan.restore = Some(pin.clone()),
            // A newer release prepared this rollback: its values start with ours (layouts only
            // append), so it is read as a prefix even if its layout is unknown here.
            PinKind::Rollback if pin.version > target => sources.push(pin.clone()),
            _ if !known(pin.version) => return Err(Refusal::Unknown { pin: pin.clone() }),
            PinKind::Plain | PinKind::Old | PinKind::Rollback => sources.push(pin.clone()),
        }
    }
    if plan.restore.is_some() {
        plan.target_exists = true;
    }
    // A rollback pin of a newer layout is only a source once its converted copy exists.
    if !plan.target_exists
        && let Some(pin) = sources.iter().find(|p| p.kind == PinKind::Rollback)
    {
        return Err(Refusal::Newer { pin: pin.clone() });
    }
    // The full copy's source: the resize's `_old`, else the rollback pin, else the newest older one.
    sources.sort_by_key(|p| {
        (
            match p.kind {
                PinKind::Old => 0,
                PinKind::Rollback => 1,
                _ => 2,
            },
            std::cmp::Reverse(p.version),
        )
    });
    plan.sources = sources;
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pins(names: &[&str]) -> Vec<CtPin> {
        names
            .iter()
            .map(|n| CtPin::parse("ct4", n).expect(n))
            .collect()
    }

    fn known(v: u32) -> bool {
        (1..=2).contains(&v)
    }

    #[test]
    fn names_round_trip_and_foreign_names_are_ignored() {
        for name in [
            "ct4_v1",
            "ct4_v2_old",
            "ct4_v2:migrating",
            "ct4_v12:rollback",
        ] {
            assert_eq!(CtPin::parse("ct4", name).expect(name).name("ct4"), name);
        }
        for name in ["ct6_v1", "ct4_v", "ct4_vx", "ct4_v1_new", "ct4"] {
            assert_eq!(CtPin::parse("ct4", name), None, "{name}");
        }
    }

    #[test]
    fn a_fresh_node_and_a_restart_need_nothing() {
        assert_eq!(plan(&[], 2, known), Ok(Plan::default()));
        let p = plan(&pins(&["ct4_v2"]), 2, known).expect("plan");
        assert!(p.target_exists && p.sources.is_empty());
    }

    #[test]
    fn an_upgrade_copies_from_the_older_layout_and_owes_its_delta() {
        let p = plan(&pins(&["ct4_v1"]), 2, known).expect("plan");
        assert!(!p.target_exists);
        assert_eq!(p.sources, pins(&["ct4_v1"]));
        // Crash after the copy, before the rename: the copy is discarded and redone.
        let p = plan(&pins(&["ct4_v1", "ct4_v2:migrating"]), 2, known).expect("plan");
        assert_eq!(p.discard, pins(&["ct4_v2:migrating"]));
        assert!(!p.target_exists);
        // Crash after the rename: only the delta is owed.
        let p = plan(&pins(&["ct4_v1", "ct4_v2"]), 2, known).expect("plan");
        assert!(p.target_exists);
        assert_eq!(p.sources, pins(&["ct4_v1"]));
    }

    #[test]
    fn a_newer_layout_is_refused_unless_a_rollback_prepared_it() {
        assert_eq!(
            plan(&pins(&["ct4_v2"]), 1, known),
            Err(Refusal::Newer {
                pin: CtPin::plain(2)
            })
        );
        // Crash between the rollback's two renames: still refused (run the command again).
        assert!(plan(&pins(&["ct4_v1", "ct4_v2"]), 1, known).is_err());
        let p = plan(&pins(&["ct4_v1", "ct4_v2:rollback"]), 1, known).expect("plan");
        assert!(p.target_exists);
        assert_eq!(p.sources, pins(&["ct4_v2:rollback"]));
        // A rollback pin without its converted copy is never taken as a source.
        assert!(plan(&pins(&["ct4_v2:rollback"]), 1, known).is_err());
        // A release that knows only layout 1 still takes a layout-3 rollback (read as a prefix).
        let p = plan(&pins(&["ct4_v1", "ct4_v3:rollback"]), 1, |v| v == 1).expect("plan");
        assert_eq!(p.sources, pins(&["ct4_v3:rollback"]));
    }

    #[test]
    fn an_abandoned_rollback_is_restored_by_the_newer_agent() {
        let p = plan(&pins(&["ct4_v1", "ct4_v2:rollback"]), 2, known).expect("plan");
        assert_eq!(p.restore, Some(pins(&["ct4_v2:rollback"])[0].clone()));
        assert!(p.target_exists);
        assert_eq!(p.sources, pins(&["ct4_v1"]));
    }

    #[test]
    fn a_resize_copies_from_old_first_and_unknown_layouts_are_refused() {
        let p = plan(&pins(&["ct4_v2_old", "ct4_v1"]), 2, known).expect("plan");
        assert_eq!(p.sources, pins(&["ct4_v2_old", "ct4_v1"]));
        assert_eq!(
            plan(&pins(&["ct4_v0"]), 2, known),
            Err(Refusal::Unknown {
                pin: CtPin::plain(0)
            })
        );
    }
}
