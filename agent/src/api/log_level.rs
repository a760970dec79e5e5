//! `POST /v1/log-level` `{"level": "debug"}` (any `EnvFilter` directive): replaces the agent's log
//! filter at run time; answers `{"level": <the filter now in force>}`. `weir log-level` calls it.

use axum::{Json, body::Bytes, http::StatusCode};

use super::error::ApiError;
use crate::logging::{self, LoggingError};

pub use weir_api::LogLevel;

/// The handler.
pub async fn set(body: Bytes) -> Result<Json<LogLevel>, ApiError> {
    let request: LogLevel = serde_json::from_slice(&body)
        .map_err(|e| ApiError::invalid(format!("the request body is not valid: {e}")))?;
    match logging::set_filter(&request.level) {
        Ok(level) => {
            tracing::info!(level, "log filter replaced");
            Ok(Json(LogLevel { level }))
        }
        Err(e @ LoggingError::Filter { .. }) => Err(ApiError::invalid(e.to_string())),
        Err(e) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            e.to_string(),
        )),
    }
}
