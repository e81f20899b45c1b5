//! Request input at the edge: JSON bodies (with size limits and FastAPI-style decode errors),
//! path ids and cursor-page query parameters.

use crate::error::{ApiError, ErrorKind, OpenAiError, PreviewError};
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use serde_json::{json, Value};
use std::collections::HashMap;
use tandem_core::records::{Order, PageRequest};
use tandem_core::validate::{FieldError, Loc, Validator};
use uuid::Uuid;

/// Reads the whole body within the body limit. Too large → 413.
pub async fn read_bytes(req: Request) -> Result<Bytes, ApiError> {
    Bytes::from_request(req, &()).await.map_err(|rejection| {
        if rejection.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(ErrorKind::PayloadTooLarge, "request body is larger than this server accepts")
        } else {
            ApiError::new(ErrorKind::Validation, rejection.body_text())
        }
    })
}

/// Reads the body as JSON. Too large → 413; not JSON → a validation error at `["body", offset]`.
pub async fn read_json(req: Request) -> Result<Value, ApiError> {
    let bytes = read_bytes(req).await?;
    // A large body takes tens of milliseconds to parse: on a blocking thread, not on the async
    // workers that serve every other request (and `/health`).
    if bytes.len() > BLOCKING_PARSE_BYTES {
        return tokio::task::spawn_blocking(move || parse_json(&bytes))
            .await
            .map_err(|e| ApiError::new(ErrorKind::Internal, format!("body parse task failed: {e}")))?;
    }
    parse_json(&bytes)
}

/// Bodies larger than this are parsed off the async workers.
const BLOCKING_PARSE_BYTES: usize = 256 << 10;

fn parse_json(bytes: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| {
        // Where a value was expected, as Python's decoder reports it: the end for a cut-off body.
        let offset = match e.classify() {
            serde_json::error::Category::Eof => bytes.len(),
            _ => byte_offset(bytes, e.line(), e.column()),
        };
        let why = e.to_string();
        ApiError::validation(vec![FieldError::new(
            vec![Loc::from("body"), Loc::Index(offset)],
            "json_invalid",
            "JSON decode error",
            json!({}),
        )
        .with_ctx(json!({ "error": why }))])
    })
}

/// serde_json reports line and column (1-based); FastAPI reports a byte offset.
fn byte_offset(bytes: &[u8], line: usize, column: usize) -> usize {
    let mut offset = 0;
    for (i, l) in bytes.split(|b| *b == b'\n').enumerate() {
        if i + 1 == line {
            return (offset + column.saturating_sub(1)).min(bytes.len());
        }
        offset += l.len() + 1;
    }
    bytes.len()
}

/// A JSON body for a preview handler.
pub struct PreviewJson(pub Value);

impl<S: Send + Sync> FromRequest<S> for PreviewJson {
    type Rejection = PreviewError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(PreviewJson(read_json(req).await?))
    }
}

/// A JSON body for an OpenAI-compatible handler (errors in that area's shape).
pub struct OpenAiJson(pub Value);

impl<S: Send + Sync> FromRequest<S> for OpenAiJson {
    type Rejection = OpenAiError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Self::Rejection> {
        // vLLM accepts only JSON bodies.
        if let Some(ct) = req.headers().get(axum::http::header::CONTENT_TYPE) {
            let ct = ct.to_str().unwrap_or("").split(';').next().unwrap_or("").trim().to_ascii_lowercase();
            if ct != "application/json" {
                return Err(ApiError::bad_param(
                    "Content-Type",
                    "Unsupported Media Type: Only 'application/json' is allowed",
                )
                .into());
            }
        }
        let value = read_json(req).await?;
        if !value.is_object() {
            return Err(ApiError::bad_param("body", "the request body must be a JSON object").into());
        }
        Ok(OpenAiJson(value))
    }
}

/// A path id. A malformed id is "not found", exactly like an unknown one.
pub fn path_id(raw: &str, what: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(raw).map_err(|_| ApiError::not_found(what))
}

/// Default and maximum page size of every cursor list.
pub const DEFAULT_LIMIT: u32 = 20;
pub const MAX_LIMIT: u32 = 100;

/// Reads `after`, `limit` and (if `with_order`) `order` from a query string.
pub fn page_request(query: &HashMap<String, String>, with_order: bool) -> Result<PageRequest, ApiError> {
    let mut v = Validator::new("query");
    let mut page = PageRequest { after: None, limit: DEFAULT_LIMIT, order: Order::Asc };
    if let Some(after) = query.get("after").filter(|s| !s.is_empty()) {
        page.after = v.at("after", |v| v.uuid(&json!(after)));
    }
    if let Some(limit) = query.get("limit") {
        let value = json!(limit);
        v.at("limit", |v| match limit.parse::<i64>() {
            Ok(n) if v.range_i64(&value, n, 1, MAX_LIMIT as i64) => page.limit = n as u32,
            Ok(_) => {}
            Err(_) => {
                v.error("int_parsing", "Input should be a valid integer, unable to parse string as an integer", &value)
            }
        });
    }
    if with_order {
        if let Some(order) = query.get("order") {
            if let Some(o) = v.at("order", |v| v.literal(&json!(order), &["asc", "desc"])) {
                page.order = if o == "desc" { Order::Desc } else { Order::Asc };
            }
        }
    }
    v.finish(page).map_err(ApiError::validation)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn page_params() {
        let p = page_request(&q(&[("limit", "1"), ("order", "desc")]), true).unwrap();
        assert_eq!((p.limit, p.order), (1, Order::Desc));
        let p = page_request(&q(&[]), true).unwrap();
        assert_eq!((p.limit, p.order, p.after), (20, Order::Asc, None));
        let e = page_request(&q(&[("limit", "101"), ("order", "up"), ("after", "x")]), true).unwrap_err();
        let locs: Vec<Value> = e.fields.iter().map(|f| serde_json::to_value(&f.loc).unwrap()).collect();
        assert_eq!(locs, vec![json!(["query", "after"]), json!(["query", "limit"]), json!(["query", "order"])]);
        assert!(page_request(&q(&[("limit", "0")]), false).is_err());
        assert!(page_request(&q(&[("limit", "ten")]), false).is_err());
    }

    #[test]
    fn offsets() {
        assert_eq!(byte_offset(b"{\n  x", 2, 3), 4);
        assert_eq!(byte_offset(b"", 1, 0), 0);
    }
}
