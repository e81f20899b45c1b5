-- Stored Responses (`POST /v1/responses` with `store: true`): the response object as returned,
-- and the conversation up to and including its output as chat messages, which a later request
-- continues with `previous_response_id`. Scoped to the entity like every other object.
CREATE TABLE stored_responses (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    id            TEXT NOT NULL UNIQUE,
    entity        TEXT NOT NULL,
    body          TEXT NOT NULL,
    conversation  TEXT NOT NULL,
    created_at    INTEGER NOT NULL
);
CREATE INDEX stored_responses_entity ON stored_responses (entity, seq);
