-- Who holds a running job and until when (Unix ms). The trainer renews its lease while it trains,
-- and a write from a trainer that no longer holds the job is refused (the same rules as on
-- PostgreSQL, where several trainers share the queue).
ALTER TABLE training_jobs ADD COLUMN lease_owner TEXT;
ALTER TABLE training_jobs ADD COLUMN lease_expires_at INTEGER;
