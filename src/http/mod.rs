//! Generic HTTP plumbing shared by kvplane's services: errors ([`error::ApiError`], one enum
//! to status codes), JSON request bodies (`body`), the `--api-token` check (`auth`), request
//! metrics by matched route (`metrics_layer`) and the dashboard (`dashboard`).
//!
//! The controller's own routes and its router live in [`crate::controller::routes`]; they are
//! re-exported here for existing users.

pub(crate) mod auth;
pub(crate) mod body;
pub(crate) mod dashboard;
pub mod error;
pub(crate) mod metrics_layer;

pub use auth::log_policy;
// The controller's routes moved to `controller::routes`; re-exported for existing users.
pub use crate::controller::routes::{
    api_routes, lookup_hash, router, Access, ApiRoute, HEALTH_ERROR_REPLY, HEALTH_TIMEOUT,
    HEALTH_UNDECODABLE, HEALTH_UNEXPECTED_REPLY, HEALTH_UNREACHABLE,
};

/// Default of `--max-body-bytes`, the largest request body accepted (a `/lookup` of a million
/// tokens is ~8 MB of JSON).
pub const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;
