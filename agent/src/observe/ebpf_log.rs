//! Drains the debug build's datapath log (`aya-log-ebpf`, feature `debug-log` of the eBPF crate,
//! loaded with `weir agent --ebpf-object`) into `tracing`, target `datapath`. The default object
//! has no log map: then nothing runs.

use aya::programs::ProgramInfo;
use tokio::io::{Interest, unix::AsyncFd};

use crate::paths::Paths;

/// Forwards aya-log records to `tracing`.
struct ToTracing;

impl log::Log for ToTracing {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let message = record.args();
        match record.level() {
            log::Level::Error => tracing::error!(target: "datapath", "{message}"),
            log::Level::Warn => tracing::warn!(target: "datapath", "{message}"),
            log::Level::Info => tracing::info!(target: "datapath", "{message}"),
            log::Level::Debug => tracing::debug!(target: "datapath", "{message}"),
            log::Level::Trace => tracing::trace!(target: "datapath", "{message}"),
        }
    }

    fn flush(&self) {}
}

/// Starts draining the loaded endpoint programs' log, if they log (call inside the runtime, once
/// the programs are pinned). Returns whether a log is being drained.
pub fn start(paths: &Paths) -> bool {
    let pin = paths.prog_pin(maps_schema::programs::FROM_ENDPOINT);
    let id = match ProgramInfo::from_pin(&pin) {
        Ok(info) => info.id(),
        Err(e) => {
            tracing::warn!(error = %e, path = %pin.display(), "cannot read the pinned program for its debug log");
            return false;
        }
    };
    let logger = match aya_log::EbpfLogger::init_from_id_with_logger(id, ToTracing) {
        Ok(logger) => logger,
        Err(aya_log::Error::MapNotFound) => {
            tracing::debug!("the loaded programs do not log (not a debug-log build)");
            return false;
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot open the programs' debug log");
            return false;
        }
    };
    // SAFETY: the fd is the logger's ring buffer map, owned by the logger, which the AsyncFd owns
    // for its whole life; `as_raw_fd` always returns that same fd.
    let fd = match unsafe { AsyncFd::register_with_interest(logger, Interest::READABLE) } {
        Ok(fd) => fd,
        Err(e) => {
            tracing::warn!(error = %e.into_parts().1, "cannot poll the programs' debug log");
            return false;
        }
    };
    tracing::warn!(
        "datapath debug logging is on (a debug-log build of the programs): every decision is logged, at a cost per packet"
    );
    tokio::spawn(drain(fd));
    true
}

async fn drain(mut fd: AsyncFd<aya_log::EbpfLogger<ToTracing>>) {
    loop {
        match fd.readable_mut().await {
            Ok(mut guard) => {
                guard.get_inner_mut().flush();
                guard.clear_ready();
            }
            Err(e) => {
                tracing::warn!(error = %e, "the programs' debug log stopped");
                return;
            }
        }
    }
}
