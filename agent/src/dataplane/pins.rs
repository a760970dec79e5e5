//! Stale-pin removal as a driver: map pins of another layout version of a map this object fills
//! (left by another release) are read back from the pin root and removed once the links run this
//! object's programs; one failing removal does not stop the others.

use std::{fs, io};

use crate::kernel::{KernelError, PinIo};
use crate::paths::Paths;

/// The real [`PinIo`]: the maps directory of a pin root on bpffs.
pub struct BpffsPins {
    paths: Paths,
}

impl BpffsPins {
    /// The map pins under `paths`.
    #[must_use]
    pub fn new(paths: &Paths) -> Self {
        Self {
            paths: paths.clone(),
        }
    }
}

impl PinIo for BpffsPins {
    fn map_pins(&self) -> Result<Vec<String>, KernelError> {
        let dir = self.paths.maps_dir();
        let list_err = |source| KernelError::Io {
            op: "list",
            what: dir.display().to_string(),
            source,
        };
        match fs::read_dir(&dir) {
            // A name that is not UTF-8 is no pin of weir's.
            Ok(entries) => entries
                .map(|e| e.map(|e| e.file_name().into_string().ok()))
                .filter_map(Result::transpose)
                .collect::<Result<_, _>>()
                .map_err(list_err),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(source) => Err(list_err(source)),
        }
    }

    fn remove_map_pin(&mut self, name: &str) -> Result<(), KernelError> {
        let pin = self.paths.map_pin(name);
        match fs::remove_file(&pin) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(KernelError::Io {
                op: "remove the stale map pin",
                what: pin.display().to_string(),
                source: e,
            }),
            _ => Ok(()),
        }
    }
}

/// Removes the pins `stale` picks out of those present; returns the names removed and the
/// failures (each left for the next start).
pub fn sweep_stale(
    io: &mut dyn PinIo,
    stale: impl Fn(&[String]) -> Vec<String>,
) -> Result<(Vec<String>, Vec<KernelError>), KernelError> {
    let present = io.map_pins()?;
    let (mut removed, mut failed) = (Vec::new(), Vec::new());
    for name in stale(&present) {
        match io.remove_map_pin(&name) {
            Ok(()) => removed.push(name),
            Err(e) => failed.push(e),
        }
    }
    Ok((removed, failed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::fake::FakeKernel;

    #[test]
    fn only_the_stale_pins_go_and_one_failure_does_not_stop_the_others() {
        let k = FakeKernel::default();
        k.pins()
            .extend(["policy_v1", "policy_v0", "ident4_v0", "ct4_v1"].map(str::to_owned));
        k.pins_failing().insert("ident4_v0".to_owned());
        let stale = |present: &[String]| {
            present
                .iter()
                .filter(|n| n.ends_with("_v0"))
                .cloned()
                .collect()
        };
        let (removed, failed) = sweep_stale(&mut k.clone(), stale).expect("listed");
        assert_eq!(removed, vec!["policy_v0".to_owned()]);
        assert_eq!(failed.len(), 1);
        let left: Vec<String> = k.pins().iter().cloned().collect();
        assert_eq!(left, vec!["ct4_v1", "ident4_v0", "policy_v1"]);
    }
}
