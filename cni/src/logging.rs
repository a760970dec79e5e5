//! Logs go to stderr (the runtime captures it) and to a log file; never to stdout, which carries
//! the result. `WEIR_CNI_LOG` overrides the configured level (an `EnvFilter` directive). Neither
//! carries terminal escapes unless stderr is a terminal: kubelet and containerd record stderr as
//! text, and the log file is always plain.

use std::{fs::OpenOptions, io::IsTerminal as _, path::Path, sync::Mutex};

use tracing_subscriber::{
    EnvFilter, Layer as _, field::MakeExt as _, layer::SubscriberExt as _,
    util::SubscriberInitExt as _,
};

/// Installs the subscriber; a log file that cannot be opened is reported on stderr only.
pub fn init(level: &str, file: Option<&Path>) {
    let filter = || {
        std::env::var("WEIR_CNI_LOG")
            .ok()
            .and_then(|d| EnvFilter::try_new(d).ok())
            .unwrap_or_else(|| EnvFilter::new(level))
    };
    let stderr = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .with_filter(filter());
    let mut file_error = None;
    let file_layer = file.and_then(|path| {
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        match OpenOptions::new().create(true).append(true).open(path) {
            Ok(f) => Some(
                tracing_subscriber::fmt::layer()
                    .with_writer(Mutex::new(f))
                    .with_ansi(false)
                    // A field formatter of its own: span fields are formatted once per formatter
                    // type, so sharing the stderr layer's would copy its colours into the file.
                    .fmt_fields(
                        tracing_subscriber::fmt::format::debug_fn(|w, field, value| {
                            if field.name() == "message" {
                                write!(w, "{value:?}")
                            } else {
                                write!(w, "{field}={value:?}")
                            }
                        })
                        .delimited(" "),
                    )
                    .with_target(false)
                    .with_filter(filter()),
            ),
            Err(e) => {
                file_error = Some(format!("cannot open the log file {}: {e}", path.display()));
                None
            }
        }
    });
    let _ = tracing_subscriber::registry()
        .with(stderr)
        .with(file_layer)
        .try_init();
    if let Some(e) = file_error {
        tracing::warn!("{e}; logging to stderr only (set logFile in the conflist)");
    }
}
