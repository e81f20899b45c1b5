-- tandem's schema. Ids are UUID strings; times are Unix milliseconds.
-- `seq` columns give every cursor-paged table a creation order that survives clock changes.

CREATE TABLE api_keys (
    id          TEXT PRIMARY KEY,
    entity      TEXT NOT NULL,
    key_hash    BLOB NOT NULL UNIQUE,      -- SHA-256 of the key; the key itself is never stored
    prefix      TEXT NOT NULL,             -- first characters of the key, to tell keys apart
    created_at  INTEGER NOT NULL,
    revoked_at  INTEGER
);

CREATE TABLE models (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    id          TEXT NOT NULL UNIQUE,
    entity      TEXT NOT NULL,
    project     TEXT NOT NULL,
    name        TEXT NOT NULL,
    base_model  TEXT NOT NULL,
    run_id      TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    UNIQUE (entity, project, name)
);

-- Deleted checkpoints stay as tombstones (deleted_at set) so that a page cursor naming one still
-- resolves; only live rows must have unique steps.
CREATE TABLE checkpoints (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    id          TEXT NOT NULL UNIQUE,
    model_id    TEXT NOT NULL REFERENCES models(id) ON DELETE CASCADE,
    step        INTEGER NOT NULL,
    path        TEXT NOT NULL,
    metrics     TEXT NOT NULL DEFAULT '{}',
    created_at  INTEGER NOT NULL,
    deleted_at  INTEGER
);
CREATE UNIQUE INDEX checkpoints_live_step ON checkpoints (model_id, step) WHERE deleted_at IS NULL;

CREATE TABLE trajectory_logs (
    seq               INTEGER PRIMARY KEY AUTOINCREMENT,
    id                TEXT NOT NULL UNIQUE,
    model_id          TEXT NOT NULL REFERENCES models(id) ON DELETE CASCADE,
    split             TEXT NOT NULL,
    step              INTEGER NOT NULL,
    metrics           TEXT NOT NULL,
    num_groups        INTEGER NOT NULL,
    num_trajectories  INTEGER NOT NULL,
    trajectory_groups TEXT NOT NULL,
    created_at        INTEGER NOT NULL
);
CREATE INDEX trajectory_logs_model ON trajectory_logs (model_id, seq);

CREATE TABLE training_jobs (
    seq               INTEGER PRIMARY KEY AUTOINCREMENT,
    id                TEXT NOT NULL UNIQUE,
    model_id          TEXT NOT NULL REFERENCES models(id) ON DELETE CASCADE,
    status            TEXT NOT NULL,
    step              INTEGER,
    config            TEXT NOT NULL,          -- the typed TrainConfig, as JSON
    trajectory_groups TEXT NOT NULL,          -- the groups exactly as submitted
    cancel_requested  INTEGER NOT NULL DEFAULT 0,
    attempts          INTEGER NOT NULL DEFAULT 0,
    error_message     TEXT,
    created_at        INTEGER NOT NULL,
    started_at        INTEGER,
    finished_at       INTEGER
);
CREATE INDEX training_jobs_status ON training_jobs (status, seq);

CREATE TABLE job_events (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    id          TEXT NOT NULL UNIQUE,
    job_id      TEXT NOT NULL REFERENCES training_jobs(id) ON DELETE CASCADE,
    type        TEXT NOT NULL,
    data        TEXT NOT NULL,
    created_at  INTEGER NOT NULL
);
CREATE INDEX job_events_job ON job_events (job_id, seq);
