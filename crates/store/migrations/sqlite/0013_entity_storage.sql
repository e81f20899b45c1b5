-- Per-entity storage (src/storage.rs): the bytes each entity's stored data takes, changed by the
-- transaction that adds or removes the data, and the entity's own quota where an operator set
-- one (NULL: the node's --storage-quota-mib; negative: none). Rows that count carry their own
-- size, so a delete takes off exactly what the insert added; a model's record counts 1024 bytes
-- (MODEL_ROW_BYTES).
CREATE TABLE entity_storage (
    entity      TEXT PRIMARY KEY,
    used_bytes  INTEGER NOT NULL DEFAULT 0,
    quota_bytes INTEGER
);
ALTER TABLE trajectory_logs ADD COLUMN size_bytes INTEGER NOT NULL DEFAULT 0;
UPDATE trajectory_logs SET size_bytes = length(CAST(trajectory_groups AS BLOB)) + length(CAST(metrics AS BLOB));
ALTER TABLE training_jobs ADD COLUMN size_bytes INTEGER NOT NULL DEFAULT 0;
UPDATE training_jobs SET size_bytes = length(CAST(config AS BLOB)) + length(CAST(trajectory_groups AS BLOB))
    + COALESCE(length(CAST(rollout_groups AS BLOB)), 0);
-- Checkpoints recorded before this migration count 0: their files' sizes are not in the database.
ALTER TABLE checkpoints ADD COLUMN size_bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE stored_responses ADD COLUMN size_bytes INTEGER NOT NULL DEFAULT 0;
UPDATE stored_responses SET size_bytes = length(CAST(body AS BLOB)) + length(CAST(conversation AS BLOB));
INSERT INTO entity_storage (entity, used_bytes)
SELECT entity, SUM(bytes) FROM (
    SELECT entity, 1024 AS bytes FROM models
    UNION ALL SELECT m.entity, l.size_bytes FROM trajectory_logs l JOIN models m ON m.id = l.model_id
    UNION ALL SELECT m.entity, j.size_bytes FROM training_jobs j JOIN models m ON m.id = j.model_id
    UNION ALL SELECT entity, size_bytes FROM datasets
    UNION ALL SELECT owner, size_bytes FROM tinker_checkpoints WHERE blob IS NOT NULL
    UNION ALL SELECT entity, size_bytes FROM stored_responses
) GROUP BY entity;
