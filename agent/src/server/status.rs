//! The one mapping from the library's request errors to gRPC status codes. Exhaustive on
//! purpose: a new error variant must be given a code here.

use tonic::Status;

use crate::daemon::state::ApiError;

/// The status for an API error.
pub fn to_status(e: ApiError) -> Status {
    match e {
        ApiError::InvalidArgument(m) => Status::invalid_argument(m),
        ApiError::NotFound(m) => Status::not_found(m),
        ApiError::PermissionDenied(m) => Status::permission_denied(m),
        ApiError::FailedPrecondition(m) => Status::failed_precondition(m),
        ApiError::Unavailable(m) => Status::unavailable(m),
        ApiError::Internal(m) => Status::internal(m),
    }
}
