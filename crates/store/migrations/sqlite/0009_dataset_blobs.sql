-- A dataset uploaded to a server with a blob store keeps its bytes there, under the SHA-256 of its
-- content (`datasets/<blob_key>`), and an empty `data`; NULL for bytes kept in the row.
ALTER TABLE datasets ADD COLUMN blob_key TEXT;
