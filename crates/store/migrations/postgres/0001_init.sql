-- tandem's schema for PostgreSQL: the SQLite schema after its migrations 0001-0006, in one step.
-- Ids are UUID strings and JSON is kept as text (not JSONB, which would reorder keys and refuse
-- `\u0000`: groups and responses must read back exactly as received); times are Unix
-- milliseconds. `seq` columns give every cursor-paged table a creation order that survives clock
-- changes: identity columns with the default cache of 1, so they grow in the order rows are
-- inserted, and writers of one list are serialised (see src/postgres/mod.rs) so that they also
-- commit in that order.

CREATE TABLE api_keys (
    id          TEXT PRIMARY KEY,
    entity      TEXT NOT NULL,
    key_hash    BYTEA NOT NULL UNIQUE,     -- SHA-256 of the key; the key itself is never stored
    prefix      TEXT NOT NULL,             -- first characters of the key, to tell keys apart
    created_at  BIGINT NOT NULL,
    revoked_at  BIGINT
);

CREATE TABLE models (
    seq         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id          TEXT NOT NULL UNIQUE,
    entity      TEXT NOT NULL,
    project     TEXT NOT NULL,
    name        TEXT NOT NULL,
    base_model  TEXT NOT NULL,
    run_id      TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    UNIQUE (entity, project, name)
);
CREATE INDEX models_entity ON models (entity, seq);

-- Deleted checkpoints stay as tombstones (deleted_at set) so that a page cursor naming one still
-- resolves; only live rows must have unique steps. Metrics objects hold numbers only (SQLite's
-- migration 0003 cleaned up the `null`s an older version wrote for non-finite values; here they
-- can never be written).
CREATE TABLE checkpoints (
    seq         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id          TEXT NOT NULL UNIQUE,
    model_id    TEXT NOT NULL REFERENCES models(id) ON DELETE CASCADE,
    step        BIGINT NOT NULL,
    path        TEXT NOT NULL,
    metrics     TEXT NOT NULL DEFAULT '{}',
    created_at  BIGINT NOT NULL,
    deleted_at  BIGINT,
    CONSTRAINT checkpoints_metrics_numbers CHECK (
        jsonb_typeof(metrics::jsonb) = 'object'
        AND NOT jsonb_path_exists(metrics::jsonb, 'strict $.* ? (@.type() != "number")'))
);
CREATE UNIQUE INDEX checkpoints_live_step ON checkpoints (model_id, step) WHERE deleted_at IS NULL;
-- The partial index above skips tombstones; deleting a model cascades to those too.
CREATE INDEX checkpoints_model ON checkpoints (model_id);

CREATE TABLE trajectory_logs (
    seq               BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id                TEXT NOT NULL UNIQUE,
    model_id          TEXT NOT NULL REFERENCES models(id) ON DELETE CASCADE,
    split             TEXT NOT NULL,
    step              BIGINT NOT NULL,
    metrics           TEXT NOT NULL,
    num_groups        BIGINT NOT NULL,
    num_trajectories  BIGINT NOT NULL,
    trajectory_groups TEXT NOT NULL,
    created_at        BIGINT NOT NULL,
    CONSTRAINT trajectory_logs_metrics_numbers CHECK (
        jsonb_typeof(metrics::jsonb) = 'object'
        AND NOT jsonb_path_exists(metrics::jsonb, 'strict $.* ? (@.type() != "number")'))
);
CREATE INDEX trajectory_logs_model ON trajectory_logs (model_id, seq);

-- `rl` jobs keep their trajectory groups in `trajectory_groups`; `sft` jobs keep their
-- conversations there (copied from the dataset at creation, so deleting it later is harmless).
-- `rollout_metrics` and `rollout_groups` are what people read of an RL job's rollouts (the
-- dashboard's curves and trajectory browser); both are NULL for SFT jobs.
CREATE TABLE training_jobs (
    seq               BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id                TEXT NOT NULL UNIQUE,
    model_id          TEXT NOT NULL REFERENCES models(id) ON DELETE CASCADE,
    kind              TEXT NOT NULL DEFAULT 'rl',
    status            TEXT NOT NULL,
    step              BIGINT,
    config            TEXT NOT NULL,          -- the typed TrainConfig or SftConfig, as JSON
    trajectory_groups TEXT NOT NULL,          -- the inputs exactly as the trainer reads them
    cancel_requested  BOOLEAN NOT NULL DEFAULT FALSE,
    attempts          BIGINT NOT NULL DEFAULT 0,
    error_message     TEXT,
    created_at        BIGINT NOT NULL,
    started_at        BIGINT,
    finished_at       BIGINT,
    rollout_metrics   TEXT,
    rollout_groups    TEXT,
    CONSTRAINT training_jobs_rollout_metrics_numbers CHECK (
        rollout_metrics IS NULL OR (
            jsonb_typeof(rollout_metrics::jsonb) = 'object'
            AND NOT jsonb_path_exists(rollout_metrics::jsonb, 'strict $.* ? (@.type() != "number")')))
);
CREATE INDEX training_jobs_status ON training_jobs (status, seq);
-- A model's jobs without scanning every tenant's: the history route (polled by the dashboard)
-- joins a model's jobs to their events.
CREATE INDEX training_jobs_model ON training_jobs (model_id, seq);

CREATE TABLE job_events (
    seq         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id          TEXT NOT NULL UNIQUE,
    job_id      TEXT NOT NULL REFERENCES training_jobs(id) ON DELETE CASCADE,
    type        TEXT NOT NULL,
    data        TEXT NOT NULL,
    created_at  BIGINT NOT NULL
);
CREATE INDEX job_events_job ON job_events (job_id, seq);

-- A JSONL dataset of conversations, versioned like a W&B artifact: each upload under the same
-- (entity, project, name) is the next version, v0 first.
CREATE TABLE datasets (
    seq         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id          TEXT NOT NULL UNIQUE,
    entity      TEXT NOT NULL,
    project     TEXT NOT NULL,
    name        TEXT NOT NULL,
    version     BIGINT NOT NULL,
    num_rows    BIGINT NOT NULL,
    size_bytes  BIGINT NOT NULL,
    data        BYTEA NOT NULL,           -- the file exactly as uploaded
    created_at  BIGINT NOT NULL,
    UNIQUE (entity, project, name, version)
);
CREATE INDEX datasets_entity ON datasets (entity, seq);

-- Stored Responses (`POST /v1/responses` with `store: true`): the response object as returned,
-- and the conversation up to and including its output as chat messages, which a later request
-- continues with `previous_response_id`. Scoped to the entity like every other object.
CREATE TABLE stored_responses (
    seq           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id            TEXT NOT NULL UNIQUE,
    entity        TEXT NOT NULL,
    body          TEXT NOT NULL,
    conversation  TEXT NOT NULL,
    created_at    BIGINT NOT NULL
);
CREATE INDEX stored_responses_entity ON stored_responses (entity, seq);
