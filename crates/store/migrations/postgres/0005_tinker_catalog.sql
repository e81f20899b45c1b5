-- The Tinker catalog: what a run keeps beyond its session (saved states `weights`, sampler
-- weights saved by name `sampler_weights`, `external_weights`), its time to live and whether it
-- is published. Files live in the checkpoint store under `blob` (`tinker/<id>`, a fresh one per
-- save); sampler weights are a checkpoint of the run's tandem record (`meta` names it).
CREATE TABLE tinker_checkpoints (
    model_id   TEXT NOT NULL,              -- the run (`{session}:train:{n}`): one owner's
    kind       TEXT NOT NULL,
    name       TEXT NOT NULL,
    owner      TEXT NOT NULL,              -- the entity
    size_bytes BIGINT NOT NULL,
    created_at BIGINT NOT NULL,           -- Unix ms
    expires_at BIGINT,                     -- Unix ms; NULL: never
    public     BOOLEAN NOT NULL DEFAULT FALSE,
    blob       TEXT,
    meta       TEXT NOT NULL,              -- JSON
    PRIMARY KEY (model_id, kind, name)
);
CREATE INDEX tinker_checkpoints_owner ON tinker_checkpoints (owner, kind, model_id);
CREATE INDEX tinker_checkpoints_expiry ON tinker_checkpoints (expires_at) WHERE expires_at IS NOT NULL;
