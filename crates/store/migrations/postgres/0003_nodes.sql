-- The processes serving or training with this database, each beating every few seconds (Unix ms
-- by the database's clock), for the cluster's system check, the dashboard and drains.
CREATE TABLE nodes (
    id           TEXT PRIMARY KEY,   -- one process start
    name         TEXT NOT NULL,      -- what the operator calls it (host:port unless set)
    role         TEXT NOT NULL,
    version      TEXT NOT NULL,
    started_at   BIGINT NOT NULL,
    heartbeat_at BIGINT NOT NULL,
    busy         BOOLEAN NOT NULL DEFAULT FALSE,  -- it holds a training job
    draining     BOOLEAN NOT NULL DEFAULT FALSE   -- an operator asked it to take no new work
);
