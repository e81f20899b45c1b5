-- Where other nodes reach a node (its advertised base URL): api nodes forward a Tinker session's
-- calls to the node that hosts it.
ALTER TABLE nodes ADD COLUMN address TEXT NOT NULL DEFAULT '';

-- The Tinker sessions of a cluster: the node hosting each (it holds the session's training models
-- in memory), and what a node taking the session over needs to rebuild its models. Written by the
-- host; `node` moves (compare and swap) when the host stops beating.
CREATE TABLE tinker_sessions (
    id         TEXT PRIMARY KEY,
    entity     TEXT NOT NULL,
    node       TEXT NOT NULL,
    models     TEXT NOT NULL DEFAULT '[]',  -- JSON: each model's run seq, base model, rank, modules
    updated_at INTEGER NOT NULL
);
CREATE INDEX tinker_sessions_node ON tinker_sessions (node);
