-- A dataset uploaded to a cluster with a blob store keeps its bytes there, under the SHA-256 of
-- its content (`datasets/<blob_key>`), and an empty `data`; NULL for bytes kept in the row.
ALTER TABLE datasets ADD COLUMN blob_key TEXT;
CREATE INDEX datasets_blob_key ON datasets (blob_key) WHERE blob_key IS NOT NULL;
