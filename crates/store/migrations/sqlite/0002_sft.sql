-- Supervised fine-tuning: uploaded datasets, and a kind for each training job.

-- A JSONL dataset of conversations, versioned like a W&B artifact: each upload under the same
-- (entity, project, name) is the next version, v0 first.
CREATE TABLE datasets (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    id          TEXT NOT NULL UNIQUE,
    entity      TEXT NOT NULL,
    project     TEXT NOT NULL,
    name        TEXT NOT NULL,
    version     INTEGER NOT NULL,
    num_rows    INTEGER NOT NULL,
    size_bytes  INTEGER NOT NULL,
    data        BLOB NOT NULL,           -- the file exactly as uploaded
    created_at  INTEGER NOT NULL,
    UNIQUE (entity, project, name, version)
);
CREATE INDEX datasets_entity ON datasets (entity, seq);

-- `rl` jobs keep their trajectory groups in `trajectory_groups`; `sft` jobs keep their
-- conversations there (copied from the dataset at creation, so deleting it later is harmless).
ALTER TABLE training_jobs ADD COLUMN kind TEXT NOT NULL DEFAULT 'rl';
