-- The processes serving or training with this store, each beating every few seconds (Unix ms).
-- A SQLite store has one process; the table is the same as PostgreSQL's so that both backends
-- answer the same questions.
CREATE TABLE nodes (
    id           TEXT PRIMARY KEY,   -- one process start
    name         TEXT NOT NULL,      -- what the operator calls it (host:port unless set)
    role         TEXT NOT NULL,
    version      TEXT NOT NULL,
    started_at   INTEGER NOT NULL,
    heartbeat_at INTEGER NOT NULL,
    busy         INTEGER NOT NULL DEFAULT 0,  -- it holds a training job
    draining     INTEGER NOT NULL DEFAULT 0   -- an operator asked it to take no new work
);
