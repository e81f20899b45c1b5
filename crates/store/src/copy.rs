//! `tandem store copy`: every record of one store into another, SQLite into PostgreSQL when a
//! team outgrows one machine, or back. The copy is made table by table in SQL, not through the
//! [`crate::Store`] methods, so that nothing is derived anew: ids, `seq` numbers (the cursor
//! order of every paged list), timestamps and the JSON text of logs and responses arrive byte
//! for byte as they were.
//!
//! Both stores are opened by their own code first, so their schemas are at the newest migration,
//! and the two schemas have the same tables and columns (checked: a difference is an error, not
//! a guess). Columns are matched by name; a value is read as what the source holds (SQLite's
//! storage class, PostgreSQL's column type) and bound as the target's column type: PostgreSQL's
//! booleans are SQLite's 0 and 1. The whole copy is one transaction on the target, so a failed
//! copy leaves it empty, and a target that already holds a record is refused.
//!
//! Verification reads every copied table back from the target after the commit and compares its
//! row count and an order-independent digest of its rows (the wrapping sum of each row's SHA-256)
//! with what was read from the source.

use crate::{Checkpoints, PostgresStore, Result, SqliteStore, StoreError};
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use sha2::{Digest, Sha256};
use sqlx::postgres::PgRow;
use sqlx::sqlite::SqliteRow;
use sqlx::{Column, Row, TypeInfo, ValueRef};

/// The tables copied, in an order their foreign keys accept. `nodes` is not: it lists the old
/// deployment's processes, and the new one's register themselves.
pub const TABLES: &[&str] = &[
    "api_keys",
    "models",
    "checkpoints",
    "trajectory_logs",
    "training_jobs",
    "job_events",
    "datasets",
    "stored_responses",
    "tinker_checkpoints",
    "tinker_secrets",
    "tinker_sessions",
    "entity_storage",
];

/// One end of a copy.
pub enum Endpoint<'a> {
    Sqlite(&'a SqliteStore),
    Postgres(&'a PostgresStore),
}

/// What a copy moved, per table: rows and the rows' digest, the same on both sides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableCopy {
    pub table: &'static str,
    pub rows: u64,
    pub digest: u128,
}

/// A value as either database holds it. Booleans are `Int` (SQLite has no other form), so one row
/// reads the same from both.
#[derive(Debug, Clone, PartialEq)]
enum Cell {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

/// A target column's type, which decides how a cell is bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Int,
    Bool,
    Real,
    Text,
    Blob,
}

impl Kind {
    /// From SQLite's declared type or PostgreSQL's `information_schema` data type.
    fn parse(declared: &str) -> Option<Kind> {
        match declared.to_ascii_lowercase().as_str() {
            "integer" | "bigint" | "int" | "int8" | "int4" | "smallint" => Some(Kind::Int),
            "boolean" | "bool" => Some(Kind::Bool),
            "real" | "double precision" | "float8" | "float4" => Some(Kind::Real),
            "text" | "character varying" | "varchar" => Some(Kind::Text),
            "blob" | "bytea" => Some(Kind::Blob),
            _ => None,
        }
    }
}

/// A table's columns on one side: (name, kind, PostgreSQL identity column).
type Columns = Vec<(String, Kind, bool)>;

fn mismatch(msg: String) -> StoreError {
    StoreError::Database(format!("store copy: {msg}"))
}

/// The digest of one row: SHA-256 of its cells (each tagged, lengths given), as a number; the
/// table's digest is the wrapping sum of its rows', the same in any order.
fn row_digest(cells: &[Cell]) -> u128 {
    let mut h = Sha256::new();
    for cell in cells {
        match cell {
            Cell::Null => h.update([0u8]),
            Cell::Int(v) => {
                h.update([1u8]);
                h.update(v.to_le_bytes());
            }
            Cell::Real(v) => {
                h.update([2u8]);
                h.update(v.to_bits().to_le_bytes());
            }
            Cell::Text(s) => {
                h.update([3u8]);
                h.update((s.len() as u64).to_le_bytes());
                h.update(s.as_bytes());
            }
            Cell::Blob(b) => {
                h.update([4u8]);
                h.update((b.len() as u64).to_le_bytes());
                h.update(b);
            }
        }
    }
    let out = h.finalize();
    u128::from_le_bytes(out[..16].try_into().expect("16 bytes"))
}

impl Endpoint<'_> {
    async fn columns(&self, table: &str) -> Result<Columns> {
        let rows: Vec<(String, String, bool)> = match self {
            Endpoint::Sqlite(s) => sqlx::query_as::<_, (String, String)>(&format!(
                "SELECT name, type FROM pragma_table_info('{table}') ORDER BY cid"
            ))
            .fetch_all(&s.pool())
            .await?
            .into_iter()
            .map(|(n, t)| (n, t, false))
            .collect(),
            Endpoint::Postgres(p) => {
                sqlx::query_as(
                    "SELECT column_name::text, data_type::text, is_identity = 'YES' FROM information_schema.columns
                 WHERE table_schema = current_schema() AND table_name = $1 ORDER BY ordinal_position",
                )
                .bind(table)
                .fetch_all(&p.pool())
                .await?
            }
        };
        rows.into_iter()
            .map(|(name, declared, identity)| {
                let kind = Kind::parse(&declared)
                    .ok_or_else(|| mismatch(format!("{table}.{name} has a type the copy does not know: {declared}")))?;
                Ok((name, kind, identity))
            })
            .collect()
    }

    async fn count(&self, table: &str) -> Result<u64> {
        let sql = format!("SELECT COUNT(*) FROM {table}");
        let n: i64 = match self {
            Endpoint::Sqlite(s) => sqlx::query_scalar(&sql).fetch_one(&s.pool()).await?,
            Endpoint::Postgres(p) => sqlx::query_scalar(&sql).fetch_one(&p.pool()).await?,
        };
        Ok(n as u64)
    }

    /// Every row of `table` (its `names` columns in that order), as it streams.
    fn rows<'a>(&'a self, sql: &'a str) -> BoxStream<'a, Result<Vec<Cell>>> {
        match self {
            Endpoint::Sqlite(s) => sqlx::query(sql)
                .fetch(&s.pool())
                .map_err(StoreError::from)
                .and_then(|row| futures::future::ready(sqlite_cells(&row)))
                .boxed(),
            Endpoint::Postgres(p) => sqlx::query(sql)
                .fetch(&p.pool())
                .map_err(StoreError::from)
                .and_then(|row| futures::future::ready(pg_cells(&row)))
                .boxed(),
        }
    }

    /// Row count and digest of `table` as this side holds it.
    async fn digest(&self, table: &str, names: &[String]) -> Result<(u64, u128)> {
        let sql = select_sql(table, names);
        let mut rows = self.rows(&sql);
        let (mut count, mut digest) = (0u64, 0u128);
        while let Some(cells) = rows.try_next().await? {
            count += 1;
            digest = digest.wrapping_add(row_digest(&cells));
        }
        Ok((count, digest))
    }
}

fn select_sql(table: &str, names: &[String]) -> String {
    format!("SELECT {} FROM {table}", names.join(", "))
}

fn sqlite_cells(row: &SqliteRow) -> Result<Vec<Cell>> {
    (0..row.columns().len())
        .map(|i| {
            let raw = row.try_get_raw(i)?;
            if raw.is_null() {
                return Ok(Cell::Null);
            }
            // The value's own storage class: SQLite keeps whatever was written, whatever the
            // column's declared type.
            Ok(match raw.type_info().name() {
                "INTEGER" | "BOOLEAN" => Cell::Int(row.try_get_unchecked(i)?),
                "REAL" => Cell::Real(row.try_get_unchecked(i)?),
                "BLOB" => Cell::Blob(row.try_get_unchecked(i)?),
                _ => Cell::Text(row.try_get_unchecked(i)?),
            })
        })
        .collect()
}

fn pg_cells(row: &PgRow) -> Result<Vec<Cell>> {
    row.columns()
        .iter()
        .enumerate()
        .map(|(i, column)| {
            let cell = match column.type_info().name() {
                "INT8" => row.try_get::<Option<i64>, _>(i)?.map(Cell::Int),
                "INT4" => row.try_get::<Option<i32>, _>(i)?.map(|v| Cell::Int(v.into())),
                "INT2" => row.try_get::<Option<i16>, _>(i)?.map(|v| Cell::Int(v.into())),
                "BOOL" => row.try_get::<Option<bool>, _>(i)?.map(|v| Cell::Int(v.into())),
                "FLOAT8" => row.try_get::<Option<f64>, _>(i)?.map(Cell::Real),
                "FLOAT4" => row.try_get::<Option<f32>, _>(i)?.map(|v| Cell::Real(v.into())),
                "BYTEA" => row.try_get::<Option<Vec<u8>>, _>(i)?.map(Cell::Blob),
                "TEXT" | "VARCHAR" => row.try_get::<Option<String>, _>(i)?.map(Cell::Text),
                other => {
                    return Err(mismatch(format!(
                        "column {} has a type the copy does not know: {other}",
                        column.name()
                    )))
                }
            };
            Ok(cell.unwrap_or(Cell::Null))
        })
        .collect()
}

/// Converts a cell for the column `table.name` of `kind`; `None` for SQL NULL.
fn for_kind(cell: Cell, kind: Kind, table: &str, name: &str) -> Result<Option<Cell>> {
    Ok(match (cell, kind) {
        (Cell::Null, _) => None,
        (c @ Cell::Int(_), Kind::Int | Kind::Bool) | (c @ Cell::Real(_), Kind::Real) => Some(c),
        (c @ Cell::Text(_), Kind::Text) | (c @ Cell::Blob(_), Kind::Blob) => Some(c),
        (Cell::Int(v), Kind::Real) => Some(Cell::Real(v as f64)),
        (c, k) => return Err(mismatch(format!("{table}.{name}: a {c:?} cannot go into a {k:?} column"))),
    })
}

macro_rules! bind_cell {
    ($q:expr, $cell:expr, $kind:expr) => {
        match ($cell, $kind) {
            (Some(Cell::Int(v)), Kind::Bool) => $q.bind(v != 0),
            (Some(Cell::Int(v)), _) => $q.bind(v),
            (Some(Cell::Real(v)), _) => $q.bind(v),
            (Some(Cell::Text(v)), _) => $q.bind(v),
            (Some(Cell::Blob(v)), _) => $q.bind(v),
            (_, Kind::Int) => $q.bind(None::<i64>),
            (_, Kind::Bool) => $q.bind(None::<bool>),
            (_, Kind::Real) => $q.bind(None::<f64>),
            (_, Kind::Text) => $q.bind(None::<String>),
            (_, Kind::Blob) => $q.bind(None::<Vec<u8>>),
        }
    };
}

/// The source's and the target's columns of `table`, by name (the digest's order: the two
/// schemas order some columns differently) with the target's kinds; an error when the two
/// differ in names.
async fn matched_columns(from: &Endpoint<'_>, to: &Endpoint<'_>, table: &str) -> Result<Columns> {
    let (source, mut target) = (from.columns(table).await?, to.columns(table).await?);
    target.sort_by(|a, b| a.0.cmp(&b.0));
    let mut a: Vec<&str> = source.iter().map(|c| c.0.as_str()).collect();
    let mut b: Vec<&str> = target.iter().map(|c| c.0.as_str()).collect();
    a.sort_unstable();
    b.sort_unstable();
    if a.is_empty() || a != b {
        return Err(mismatch(format!("table {table} differs: the source has columns {a:?}, the target {b:?}")));
    }
    Ok(target)
}

/// Copies every table of [`TABLES`] from `from` into `to`, which must hold none of their rows,
/// in one transaction on `to`; then reads each back and checks its count and digest against the
/// source's. Returns what each table holds.
pub async fn copy_records(from: &Endpoint<'_>, to: &Endpoint<'_>) -> Result<Vec<TableCopy>> {
    let mut plans = Vec::with_capacity(TABLES.len());
    for &table in TABLES {
        let n = to.count(table).await?;
        if n > 0 {
            return Err(StoreError::Conflict(format!(
                "the target store is not empty ({table} holds {n} rows): copy into a new database"
            )));
        }
        plans.push((table, matched_columns(from, to, table).await?));
    }
    let mut copied = Vec::with_capacity(plans.len());
    // sqlx's queries are typed by their database: the same loop for each target backend.
    macro_rules! copy_tables {
        ($pool:expr, $postgres:expr) => {{
            let mut tx = $pool.begin().await?;
            for (table, columns) in &plans {
                let (insert, select) = (insert_sql(table, columns, $postgres), select_sql(table, &names(columns)));
                let (mut rows, mut count, mut digest) = (from.rows(&select), 0u64, 0u128);
                while let Some(cells) = rows.try_next().await? {
                    digest = digest.wrapping_add(row_digest(&cells));
                    count += 1;
                    let mut q = sqlx::query(&insert);
                    for (cell, (name, kind, _)) in cells.into_iter().zip(columns) {
                        q = bind_cell!(q, for_kind(cell, *kind, table, name)?, *kind);
                    }
                    q.execute(&mut *tx).await?;
                }
                // Identity columns (PostgreSQL's) go on from the copied maximum, so new rows sort
                // after these.
                for (name, _, _) in columns.iter().filter(|c| c.2) {
                    sqlx::query(&format!(
                        "SELECT setval(pg_get_serial_sequence('{table}', '{name}'),
                                       COALESCE((SELECT MAX({name}) FROM {table}), 0) + 1, false)"
                    ))
                    .execute(&mut *tx)
                    .await?;
                }
                copied.push(TableCopy { table, rows: count, digest });
            }
            tx.commit().await?;
        }};
    }
    match to {
        Endpoint::Sqlite(s) => copy_tables!(&s.pool(), false),
        Endpoint::Postgres(p) => copy_tables!(&p.pool(), true),
    }
    for (copy, (table, columns)) in copied.iter().zip(&plans) {
        let (rows, digest) = to.digest(table, &names(columns)).await?;
        if (rows, digest) != (copy.rows, copy.digest) {
            return Err(mismatch(format!(
                "verification failed for {table}: {} rows read from the source, {rows} in the target{}",
                copy.rows,
                if rows == copy.rows { " with different contents" } else { "" }
            )));
        }
    }
    Ok(copied)
}

fn names(columns: &Columns) -> Vec<String> {
    columns.iter().map(|c| c.0.clone()).collect()
}

fn insert_sql(table: &str, columns: &Columns, postgres: bool) -> String {
    let names: Vec<&str> = columns.iter().map(|c| c.0.as_str()).collect();
    let marks: Vec<String> =
        (1..=columns.len()).map(|i| if postgres { format!("${i}") } else { "?".to_string() }).collect();
    let overriding = if postgres && columns.iter().any(|c| c.2) { " OVERRIDING SYSTEM VALUE" } else { "" };
    format!("INSERT INTO {table} ({}){overriding} VALUES ({})", names.join(", "), marks.join(", "))
}

/// What [`copy_files`] did with the checkpoint and Tinker files the records name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FilesCopy {
    /// Uploaded from the local directory into the blob store.
    pub uploaded: usize,
    /// Not in the local directory but already in the blob store.
    pub in_blob_store: usize,
    /// Neither here nor there (each a path the records name).
    pub missing: Vec<String>,
}

/// Puts the files of every path in `live` (the source's checkpoint and Tinker state paths,
/// [`crate::Store::live_checkpoint_paths`]) into `checkpoints`' blob store, from its local
/// directory (the source's `<data-dir>/checkpoints`). Without a blob store it only checks that
/// each is in the local directory. Paths found nowhere are reported, not skipped silently.
pub async fn copy_files(live: &[String], checkpoints: &Checkpoints) -> Result<FilesCopy> {
    let mut out = FilesCopy::default();
    for relative in live {
        let local = checkpoints.dir().resolve(relative).filter(|p| p.is_dir());
        match (local, checkpoints.remote()) {
            (Some(_), Some(_)) => {
                checkpoints.upload(relative).await?;
                out.uploaded += 1;
            }
            (Some(_), None) => {}
            (None, Some(remote)) if !remote.list(relative).await?.is_empty() => out.in_blob_store += 1,
            (None, _) => out.missing.push(relative.clone()),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_digest_depends_on_every_cell_and_a_table_digest_on_no_order() {
        let a = [Cell::Int(1), Cell::Text("x".into()), Cell::Null];
        let b = [Cell::Int(1), Cell::Text("x".into()), Cell::Blob(vec![])];
        let c = [Cell::Int(1), Cell::Blob(b"x".to_vec()), Cell::Null];
        assert_ne!(row_digest(&a), row_digest(&b));
        assert_ne!(row_digest(&a), row_digest(&c), "a text and a blob of the same bytes differ");
        let (x, y) = (row_digest(&a), row_digest(&b));
        assert_eq!(x.wrapping_add(y), y.wrapping_add(x));
        // Text lengths are part of the digest: ("ab", "c") is not ("a", "bc").
        let split1 = [Cell::Text("ab".into()), Cell::Text("c".into())];
        let split2 = [Cell::Text("a".into()), Cell::Text("bc".into())];
        assert_ne!(row_digest(&split1), row_digest(&split2));
    }

    #[test]
    fn cells_go_into_columns_of_their_kind_only() {
        assert_eq!(for_kind(Cell::Int(1), Kind::Bool, "t", "c").unwrap(), Some(Cell::Int(1)));
        assert_eq!(for_kind(Cell::Int(2), Kind::Real, "t", "c").unwrap(), Some(Cell::Real(2.0)));
        assert_eq!(for_kind(Cell::Null, Kind::Blob, "t", "c").unwrap(), None);
        assert!(for_kind(Cell::Text("1".into()), Kind::Int, "t", "c").is_err());
        assert!(for_kind(Cell::Blob(vec![1]), Kind::Text, "t", "c").is_err());
        assert_eq!(Kind::parse("double precision"), Some(Kind::Real));
        assert_eq!(Kind::parse("BYTEA"), Some(Kind::Blob));
        assert_eq!(Kind::parse("jsonb"), None);
    }

    #[test]
    fn inserts_override_identity_columns_on_postgres_only() {
        let columns: Columns = vec![("seq".into(), Kind::Int, true), ("id".into(), Kind::Text, false)];
        assert_eq!(
            insert_sql("models", &columns, true),
            "INSERT INTO models (seq, id) OVERRIDING SYSTEM VALUE VALUES ($1, $2)"
        );
        assert_eq!(insert_sql("models", &columns, false), "INSERT INTO models (seq, id) VALUES (?, ?)");
    }
}
