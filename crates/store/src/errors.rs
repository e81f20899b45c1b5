//! How the backends' failures become [`StoreError`]s, and the pool settings that bound how long a
//! call may wait for the database.
//!
//! One mapping for both databases and the blob store, so that the same situation gives the same
//! variant wherever it happened: a constraint is `Conflict` or `NotFound`; a database or blob
//! store that does not answer is `Unavailable` (the api's 503 with `Retry-After`); a full disk is
//! `Full` (507). Everything else stays `Database`/`Io` (a 500: a bug or a damaged store).

use crate::StoreError;
use std::error::Error as StdError;
use std::time::Duration;

/// How many connections a store keeps and how long a call waits for one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolSettings {
    /// Connections at most (default: the backend's own).
    pub size: Option<u32>,
    /// How long a call waits for a connection before it fails as `Unavailable` (default: the
    /// backend's own). On PostgreSQL this is also how long a call waits while the server is
    /// down: the pool keeps trying to connect until then.
    pub acquire_timeout: Option<Duration>,
    /// PostgreSQL only: the server cancels a statement that runs longer, waits on locks
    /// included (default [`POSTGRES_STATEMENT_TIMEOUT`]; zero: no limit). The call then fails as
    /// `Unavailable`, instead of holding its request and connection for as long as a stuck lock.
    pub statement_timeout: Option<Duration>,
}

impl PoolSettings {
    /// PostgreSQL: how long one call into the store may take before the client gives up on it
    /// (`Deadline`): twice the statement timeout, so that a call of a few statements the server
    /// bounds is never cut short, but a call whose statements the network drops ends; `None`
    /// when the statement timeout is zero (no limit).
    pub fn call_deadline(&self) -> Option<Duration> {
        let statement = self.statement_timeout.unwrap_or(POSTGRES_STATEMENT_TIMEOUT);
        (!statement.is_zero()).then(|| statement * 2)
    }
}

/// PostgreSQL's default acquire timeout: a stopped or unreachable server is a 503 within it.
pub const POSTGRES_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(2);
/// PostgreSQL's default statement timeout: far above any statement tandem makes on a healthy
/// server (milliseconds), short enough that a stuck lock frees the request.
pub const POSTGRES_STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);
/// SQLite's: its waits are queueing behind its one writer (there is no server to lose), so they
/// may be longer than PostgreSQL's before a request is turned away.
pub const SQLITE_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

/// `errno` values of a full disk or an exhausted quota (Linux's ENOSPC and EDQUOT).
const ENOSPC: i32 = 28;
const EDQUOT: i32 = 122;

/// PostgreSQL SQLSTATEs that say the server is going away or cannot take the call now: among
/// them a statement cancelled by `statement_timeout` (or an operator) and a lock not granted
/// within `lock_timeout`.
fn postgres_unavailable(code: &str) -> bool {
    code.starts_with("08") // connection exception
        || matches!(code, "57P01" | "57P02" | "57P03" | "53300" | "53200" | "40001" | "40P01" | "57014" | "55P03")
}

/// SQLite's primary result codes (the low byte of the extended code sqlx reports).
const SQLITE_BUSY: i64 = 5;
const SQLITE_LOCKED: i64 = 6;
const SQLITE_IOERR: i64 = 10;
const SQLITE_FULL: i64 = 13;

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        use sqlx::error::ErrorKind;
        if let Some(db) = e.as_database_error() {
            match db.kind() {
                // The row it refers to (a model, a job) was deleted meanwhile.
                ErrorKind::ForeignKeyViolation => return StoreError::NotFound,
                ErrorKind::UniqueViolation => return StoreError::Conflict(e.to_string()),
                _ => {}
            }
            let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
            // PostgreSQL's disk_full; SQLite's codes are numbers.
            if code == "53100" {
                return StoreError::Full(db.message().to_string());
            }
            if postgres_unavailable(&code) {
                return StoreError::Unavailable(format!("the database: {}", db.message()));
            }
            if let Ok(extended) = code.parse::<i64>() {
                match extended & 0xff {
                    SQLITE_FULL => return StoreError::Full(format!("the database: {}", db.message())),
                    SQLITE_BUSY | SQLITE_LOCKED | SQLITE_IOERR => {
                        return StoreError::Unavailable(format!("the database: {}", db.message()))
                    }
                    _ => {}
                }
            }
            return StoreError::Database(e.to_string());
        }
        match e {
            sqlx::Error::RowNotFound => StoreError::NotFound,
            sqlx::Error::PoolTimedOut => {
                StoreError::Unavailable("no database connection within the pool's acquire timeout".into())
            }
            sqlx::Error::PoolClosed => StoreError::Unavailable("the database pool is closed".into()),
            // The database's socket (or, for SQLite, its file).
            sqlx::Error::Io(io) if is_full(&io) => StoreError::Full(io.to_string()),
            sqlx::Error::Io(io) => StoreError::Unavailable(format!("the database connection failed: {io}")),
            sqlx::Error::Tls(_) | sqlx::Error::Protocol(_) | sqlx::Error::WorkerCrashed => {
                StoreError::Unavailable(format!("the database connection failed: {e}"))
            }
            other => StoreError::Database(other.to_string()),
        }
    }
}

/// A file-system failure (checkpoint files, the data directory): a full disk is `Full`, the rest
/// `Io`. Socket failures reach the store as `sqlx::Error::Io`, mapped above.
impl From<std::io::Error> for StoreError {
    fn from(e: std::io::Error) -> Self {
        if is_full(&e) {
            StoreError::Full(e.to_string())
        } else {
            StoreError::Io(e.to_string())
        }
    }
}

fn is_full(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(ENOSPC | EDQUOT))
}

/// True when any error in `e`'s source chain is a full disk (object_store and tempfile wrap the
/// `io::Error`).
pub(crate) fn full_in_chain(e: &(dyn StdError + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(err) = next {
        if err.downcast_ref::<std::io::Error>().is_some_and(is_full) {
            return true;
        }
        next = err.source();
    }
    false
}

/// A blob store failure: `NotFound` for a missing object, `Full` for a full local disk
/// (`file://`), `Unavailable` when the store could not be reached or answered with a server
/// error after the client's retries, `Io` for the rest (a refused credential, a bad key).
pub(crate) fn blob_error(e: object_store::Error) -> StoreError {
    if full_in_chain(&e) {
        return StoreError::Full(format!("blob store: {e}"));
    }
    match e {
        object_store::Error::NotFound { .. } => StoreError::NotFound,
        object_store::Error::Generic { .. } => StoreError::Unavailable(format!("blob store: {e}")),
        other => StoreError::Io(format!("blob store: {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_timeouts_and_lost_connections_are_unavailable() {
        assert!(matches!(StoreError::from(sqlx::Error::PoolTimedOut), StoreError::Unavailable(_)));
        assert!(matches!(StoreError::from(sqlx::Error::PoolClosed), StoreError::Unavailable(_)));
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(matches!(StoreError::from(sqlx::Error::Io(reset)), StoreError::Unavailable(_)));
        assert!(matches!(StoreError::from(sqlx::Error::RowNotFound), StoreError::NotFound));
        assert!(matches!(StoreError::from(sqlx::Error::ColumnNotFound("x".into())), StoreError::Database(_)));
    }

    #[test]
    fn a_full_disk_is_full_however_it_is_wrapped() {
        let enospc = || std::io::Error::from_raw_os_error(ENOSPC);
        assert!(matches!(StoreError::from(enospc()), StoreError::Full(_)));
        assert!(matches!(StoreError::from(std::io::Error::from_raw_os_error(EDQUOT)), StoreError::Full(_)));
        assert!(matches!(StoreError::from(sqlx::Error::Io(enospc())), StoreError::Full(_)));
        // A file that is missing or cut short is not a full disk, nor an outage.
        let missing = std::io::Error::from(std::io::ErrorKind::NotFound);
        assert!(matches!(StoreError::from(missing), StoreError::Io(_)));
        let short = std::io::Error::from(std::io::ErrorKind::UnexpectedEof);
        assert!(matches!(StoreError::from(short), StoreError::Io(_)));
        let wrapped = object_store::Error::Generic { store: "LocalFileSystem", source: Box::new(enospc()) };
        assert!(matches!(blob_error(wrapped), StoreError::Full(_)));
    }

    #[test]
    fn blob_store_failures() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let e = object_store::Error::Generic { store: "S3", source: Box::new(refused) };
        assert!(matches!(blob_error(e), StoreError::Unavailable(_)));
        let e = object_store::Error::NotFound { path: "x".into(), source: "gone".into() };
        assert!(matches!(blob_error(e), StoreError::NotFound));
        let e = object_store::Error::PermissionDenied { path: "x".into(), source: "no".into() };
        assert!(matches!(blob_error(e), StoreError::Io(_)));
    }

    #[test]
    fn sqlstates() {
        assert!(postgres_unavailable("08006"));
        assert!(postgres_unavailable("57P01"));
        // statement_timeout and lock_timeout: a stuck lock is a 503 to retry, not a 500.
        assert!(postgres_unavailable("57014"));
        assert!(postgres_unavailable("55P03"));
        assert!(!postgres_unavailable("23505"));
        assert!(!postgres_unavailable("42P01"));
    }

    #[tokio::test]
    async fn a_full_sqlite_database_is_full() {
        // max_page_count caps the file: inserts past it fail as SQLITE_FULL, as on a full disk.
        use sqlx::Connection;
        let mut conn = sqlx::SqliteConnection::connect("sqlite::memory:").await.unwrap();
        sqlx::query("PRAGMA max_page_count = 8").execute(&mut conn).await.unwrap();
        sqlx::query("CREATE TABLE t (x TEXT)").execute(&mut conn).await.unwrap();
        let mut last = Ok(());
        for _ in 0..64 {
            last = sqlx::query("INSERT INTO t VALUES (?)").bind("x".repeat(4000)).execute(&mut conn).await.map(|_| ());
            if last.is_err() {
                break;
            }
        }
        let e = StoreError::from(last.expect_err("the capped database fills up"));
        assert!(matches!(e, StoreError::Full(_)), "{e:?}");
    }
}
