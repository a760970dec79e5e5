//! `cargo xtask demo` runs this (root; `WEIR_BIN` names the `weir` it built): see `tests::demo`.

fn main() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!(
            "the demo needs root: it loads BPF programs and creates network namespaces; run it as root"
        );
        std::process::exit(2);
    }
    // A failed step panics with what failed; say so as the demo's outcome, not as a crash.
    std::panic::set_hook(Box::new(|info| {
        let payload = info.payload();
        let what = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a step failed".to_owned());
        let at = info
            .location()
            .map_or_else(String::new, |l| format!(" ({}:{})", l.file(), l.line()));
        eprintln!("demo failed: {what}{at}");
    }));
    tests::demo::run(&mut |line| println!("{line}"));
}
