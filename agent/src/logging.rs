//! The `weir` binary's logs: text (colours only on a terminal) or JSON lines on stderr
//! (`--log-format`, `WEIR_LOG_FORMAT`), filtered by an `EnvFilter` (`--log`, `WEIR_LOG`) that the
//! running agent can replace (`weir log-level`, `POST /v1/log-level`) through a reload layer.

use std::{io::IsTerminal as _, sync::OnceLock};

use tracing_subscriber::{
    EnvFilter, Layer as _, Registry, layer::SubscriberExt as _, reload,
    util::SubscriberInitExt as _,
};

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines (colours only when stderr is a terminal).
    #[default]
    Text,
    /// One JSON object per line (for log collectors; the DaemonSet's choice).
    Json,
}

/// Errors of the log set-up.
#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    /// The filter does not parse.
    #[error(
        "invalid log filter {directive:?}: {source}; use a level (error, warn, info, debug, trace) or `target=level,…`"
    )]
    Filter {
        /// The directive given.
        directive: String,
        /// The parser's complaint.
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },
    /// A subscriber was installed already.
    #[error("the log subscriber is already installed: {0}")]
    Installed(#[source] tracing_subscriber::util::TryInitError),
    /// This process installed no reloadable filter (only the agent has one).
    #[error("this process has no reloadable log filter")]
    NotReloadable,
    /// The subscriber went away.
    #[error("cannot replace the log filter: {0}")]
    Reload(#[source] reload::Error),
}

static FILTER: OnceLock<reload::Handle<EnvFilter, Registry>> = OnceLock::new();

fn parse(directive: &str) -> Result<EnvFilter, LoggingError> {
    EnvFilter::try_new(directive).map_err(|source| LoggingError::Filter {
        directive: directive.to_owned(),
        source,
    })
}

/// Installs the process's subscriber: `directive` filters, `format` writes, to stderr.
pub fn init(format: LogFormat, directive: &str) -> Result<(), LoggingError> {
    let (filter, handle) = reload::Layer::new(parse(directive)?);
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let output = match format {
        LogFormat::Text => fmt
            // Colours only for a terminal: a DaemonSet's or a service's log is recorded as text.
            .with_ansi(std::io::stderr().is_terminal())
            .boxed(),
        LogFormat::Json => fmt
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_ansi(false)
            .boxed(),
    };
    tracing_subscriber::registry()
        .with(filter)
        .with(output)
        .try_init()
        .map_err(LoggingError::Installed)?;
    // Only the first subscriber installs; a second `init` failed above.
    let _ = FILTER.set(handle);
    Ok(())
}

/// Replaces the filter of the running process; returns the filter now in force.
pub fn set_filter(directive: &str) -> Result<String, LoggingError> {
    let filter = parse(directive)?;
    let handle = FILTER.get().ok_or(LoggingError::NotReloadable)?;
    handle.reload(filter).map_err(LoggingError::Reload)?;
    current().ok_or(LoggingError::NotReloadable)
}

/// The filter in force, as a directive.
#[must_use]
pub fn current() -> Option<String> {
    FILTER.get()?.with_current(ToString::to_string).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_filter_is_refused_with_the_directive() {
        let err = parse("info,=[").expect_err("bad filter").to_string();
        assert!(err.contains("info,=["), "{err}");
        assert!(parse("agent=debug,info").is_ok());
    }
}
