-- Who holds a running job and until when (Unix ms by the database's clock). Trainers renew the
-- lease while they train; a job whose lease ran out is re-queued by any trainer, and writes of
-- the trainer that lost it are refused.
ALTER TABLE training_jobs ADD COLUMN lease_owner TEXT;
ALTER TABLE training_jobs ADD COLUMN lease_expires_at BIGINT;
-- Trainers look for expired leases every few seconds: only running jobs are read.
CREATE INDEX training_jobs_running_lease ON training_jobs (lease_expires_at) WHERE status = 'running';
