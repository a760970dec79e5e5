//! `weir-cni`: the CNI plugin (CNI 1.0.0 / 1.1.0). Not implemented yet: every command answers with a CNI error.

use std::io::Write as _;

fn main() {
    let command = std::env::var("CNI_COMMAND").unwrap_or_default();
    let error = serde_json::json!({
        "cniVersion": "1.0.0",
        "code": 100,
        "msg": format!("weir-cni does not implement {command:?} yet"),
        "details": "the CNI plugin lands with the weir-cni issue; use another plugin until then",
    });
    let _ = writeln!(std::io::stdout(), "{error}");
    std::process::exit(1);
}
