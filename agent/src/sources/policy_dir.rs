//! The policy directory as a source of the loop.

use std::time::Duration;

use crate::{
    applier::{Command, LoopHandle},
    policy,
};

/// The policy directory as a source of the loop: re-read when its fingerprint changes (a cheap
/// stat every 50 ms); a valid set replaces the policies, a bad document keeps the last good ones.
pub async fn run(dataplane_loop: LoopHandle, dir: std::path::PathBuf) {
    let mut seen = policy::load::fingerprint(&dir);
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = policy::load::fingerprint(&dir);
        if now == seen {
            continue;
        }
        seen = now;
        let (set, errors) = policy::load::load_dir(&dir);
        let command = if errors.is_empty() {
            Command::Policies { set, errors }
        } else {
            Command::PoliciesRefused(errors)
        };
        if dataplane_loop.send(command).is_err() {
            return;
        }
    }
}
