-- Secrets every node of a cluster shares (the key Tinker's download URLs are signed with): the
-- first node to ask stores a random one, the rest read it. Hex text.
CREATE TABLE tinker_secrets (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
