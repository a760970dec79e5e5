//! API errors: `{"error": {"code": "...", "message": "..."}}` with a status code.

use axum::{
    Json,
    http::StatusCode,
    response::{IntoResponse, Response},
};
use serde::{Deserialize, Serialize};

use weir_api::code;

use crate::{
    calc::ipam_service::IpamServiceError, control::node::NodeError,
    sources::registry::RegistryError,
};

/// An API error (on the wire: `weir_api::ErrorBody`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ApiError {
    /// Machine-readable code (kebab-case).
    pub code: String,
    /// What to fix.
    pub message: String,
    /// HTTP status.
    #[serde(skip)]
    pub status: u16,
}

impl ApiError {
    /// An error with a status.
    pub fn new(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        Self {
            code: code.to_owned(),
            message: message.into(),
            status: status.as_u16(),
        }
    }

    /// 400 invalid-request.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code::INVALID_REQUEST, message)
    }

    /// 503: the dataplane did not apply.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            code::DATAPLANE_NOT_READY,
            message,
        )
    }
}

#[derive(Serialize)]
struct Body<'a> {
    error: &'a ApiError,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, Json(Body { error: &self })).into_response()
    }
}

impl From<NodeError> for ApiError {
    fn from(e: NodeError) -> Self {
        match e {
            NodeError::Registry(
                e @ (RegistryError::Invalid { .. } | RegistryError::TooManyAddresses { .. }),
            ) => Self::invalid(e.to_string()),
            e @ (NodeError::Registry(RegistryError::Io { .. })
            | NodeError::Identity(crate::calc::identity::IdentityError::Io { .. })) => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                code::STORAGE_UNAVAILABLE,
                e.to_string(),
            ),
            other => Self::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                code::INTERNAL,
                other.to_string(),
            ),
        }
    }
}

impl From<IpamServiceError> for ApiError {
    fn from(e: IpamServiceError) -> Self {
        use crate::calc::pod_ipam::AnnotationError as A;
        use ipam::IpamError as I;
        let message = e.to_string();
        match e {
            // The cause's code and status, with the message that names the annotation.
            IpamServiceError::Annotated { source, .. } => Self {
                message,
                ..Self::from(*source)
            },
            IpamServiceError::Annotation(A::UnknownPool { .. } | A::Family { .. }) => {
                Self::new(StatusCode::BAD_REQUEST, code::UNKNOWN_POOL, message)
            }
            IpamServiceError::Annotation(_) => Self::invalid(message),
            IpamServiceError::Exhausted { .. } => {
                Self::new(StatusCode::CONFLICT, code::EXHAUSTED, message)
            }
            IpamServiceError::Invalid(_) | IpamServiceError::PoolFlag { .. } => {
                Self::invalid(message)
            }
            IpamServiceError::Timeout(_) => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, code::TIMEOUT, message)
            }
            IpamServiceError::Ipam(I::UnknownPool { .. } | I::PoolDisabled { .. }) => {
                Self::new(StatusCode::BAD_REQUEST, code::UNKNOWN_POOL, message)
            }
            IpamServiceError::Ipam(I::NotInAnyPool { .. }) => {
                Self::new(StatusCode::BAD_REQUEST, code::ADDRESS_NOT_IN_POOL, message)
            }
            IpamServiceError::Ipam(I::NoQualifiedPool { .. }) => {
                Self::new(StatusCode::CONFLICT, code::EXHAUSTED, message)
            }
            IpamServiceError::Ipam(I::InvalidArgument { .. } | I::HandleCap { .. }) => {
                Self::invalid(message)
            }
            IpamServiceError::Ipam(I::Block { .. }) => {
                Self::new(StatusCode::CONFLICT, code::ADDRESS_IN_USE, message)
            }
            IpamServiceError::Persist { .. } => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                code::STORAGE_UNAVAILABLE,
                message,
            ),
            IpamServiceError::Ipam(I::Store(ipam::store::StoreError::Unavailable { .. }))
            | IpamServiceError::Stopped => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                code::DATASTORE_UNAVAILABLE,
                message,
            ),
            _ => Self::new(StatusCode::INTERNAL_SERVER_ERROR, code::INTERNAL, message),
        }
    }
}
