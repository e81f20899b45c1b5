//! Backend-neutral pieces of turning stored text into records and back: both backends keep ids and
//! JSON as text, so they parse and write them the same way (and a row written by one reads the
//! same through the other).

use crate::{Result, StoreError};
use serde_json::Value;
use std::collections::BTreeMap;
use tandem_core::records::Page;
use uuid::Uuid;

pub(crate) fn parse_uuid(s: &str, col: &str) -> Result<Uuid> {
    Uuid::parse_str(s).map_err(|e| StoreError::Database(format!("bad uuid in {col}: {e}")))
}

pub(crate) fn parse_json(s: &str, col: &str) -> Result<Value> {
    serde_json::from_str(s).map_err(|e| StoreError::Database(format!("bad json in {col}: {e}")))
}

/// A metrics object's finite numbers. Anything else (a `null` that an older version wrote for a
/// non-finite value) is skipped, so one bad value can never make a model's checkpoints or logs
/// unreadable.
pub(crate) fn parse_metrics(s: &str, col: &str) -> Result<BTreeMap<String, f64>> {
    let map: serde_json::Map<String, Value> =
        serde_json::from_str(s).map_err(|e| StoreError::Database(format!("bad metrics in {col}: {e}")))?;
    Ok(map.into_iter().filter_map(|(k, v)| v.as_f64().filter(|x| x.is_finite()).map(|x| (k, x))).collect())
}

/// Only finite numbers are stored: JSON has no NaN or infinity (serde_json would write `null`).
pub(crate) fn metrics_text(m: &BTreeMap<String, f64>) -> String {
    let finite: BTreeMap<&String, &f64> = m.iter().filter(|(_, v)| v.is_finite()).collect();
    serde_json::to_string(&finite).unwrap_or_else(|_| "{}".to_string())
}

/// Splits `limit + 1` fetched rows into a page and whether more follow.
pub(crate) fn page<T>(mut items: Vec<T>, limit: u32) -> Page<T> {
    let has_more = items.len() > limit as usize;
    items.truncate(limit as usize);
    Page { items, has_more }
}
