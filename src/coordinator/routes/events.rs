//! The usage events MP servers send: `POST /quota/events` (the documented body) and `POST
//! /events` (0.5.6's batches), admitted whole and applied in slices.

use super::{invalid, parse, JsonBody};
use crate::coordinator::model::events::{Batch, CacheEvents, LegacyEvents};
use crate::coordinator::model::{Ingested, SLICE_OPS};
use crate::coordinator::state::api_state::ApiState;
use crate::web::error::ApiError;
use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;

fn check_events(s: &ApiState, n: usize, field: &'static str) -> Result<(), ApiError> {
    if n > s.max_events_per_request {
        s.refused.events_per_request.fetch_add(1, Ordering::Relaxed);
        return Err(invalid(
            s,
            field,
            format!(
                "{n} events in one request; at most {} accepted",
                s.max_events_per_request
            ),
        ));
    }
    Ok(())
}

pub(super) async fn legacy_events(
    State(s): State<Arc<ApiState>>,
    JsonBody(body): JsonBody,
) -> Result<Json<Value>, ApiError> {
    let b: LegacyEvents = parse(&s, &body)?;
    if b.seq < 1 {
        return Err(invalid(&s, "seq", "seq must be >= 1"));
    }
    check_events(&s, b.events.len(), "events")?;
    let got = ingest(&s, vec![Batch::from(b)]).await?;
    Ok(Json(json!({ "recorded": got.recorded })))
}

pub(super) async fn events(
    State(s): State<Arc<ApiState>>,
    JsonBody(body): JsonBody,
) -> Result<Json<Value>, ApiError> {
    let b: CacheEvents = parse(&s, &body)?;
    let n: usize = b.batches.iter().map(|b| b.entries.len()).sum();
    check_events(&s, n, "batches")?;
    if b.batches
        .iter()
        .any(|b| b.seq < 1 || b.instance_id.is_empty())
    {
        return Err(invalid(
            &s,
            "batches",
            "every batch needs a non-empty instance_id and seq >= 1",
        ));
    }
    let batches: Vec<Batch> = b.batches.into_iter().map(Batch::from).collect();
    let got = ingest(&s, batches).await?;
    Ok(Json(json!(got)))
}

/// Admits the batches and applies the first [`SLICE_OPS`] events in one job (a typical
/// request is one job), then the rest one slice per job (the owner answers other callers in
/// between). The reply waits for the last slice, so usage read after a reply includes the
/// request.
async fn ingest(s: &ApiState, batches: Vec<Batch>) -> Result<Ingested, ApiError> {
    let (got, rest) = s.handle.admit(batches, SLICE_OPS).await?;
    for b in rest {
        s.handle.apply_slice(b).await?;
    }
    Ok(got)
}
