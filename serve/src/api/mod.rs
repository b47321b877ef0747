//! `/api/v1`: the control plane's rows as JSON, and its calls, a module per
//! resource. Each handler runs in its caller's [`Session`], so what it reads
//! and may call is what the caller's key allows; handlers only shape
//! queries and answers.
//!
//! [`Session`]: crate::session::Session

use utoipa_axum::router::OpenApiRouter;

use crate::AppState;

mod datasets;
mod events;
pub mod extract;
mod incidents;
mod login;
mod pipelines;
mod runners;
mod runs;
mod sensors;
mod syncs;
mod webhooks;

pub use extract::{limit, Body, Page, Params, PathOf, PAGE_DEFAULT, PAGE_MAX};

/// The endpoints under `/api/v1` but the logs' ([`crate::logs::routes`]),
/// each with its OpenAPI operation: the document at
/// `/api/v1/openapi.json` is made from these, so it cannot drift from what
/// is served.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .merge(login::routes())
        .merge(pipelines::routes())
        .merge(runs::routes())
        .merge(syncs::routes())
        .merge(events::routes())
        .merge(runners::routes())
        .merge(datasets::routes())
        .merge(sensors::routes())
        .merge(webhooks::routes())
        .merge(incidents::routes())
}
