-- A model's jobs without scanning every tenant's: the history route (polled by the dashboard)
-- joins a model's jobs to their events.
CREATE INDEX IF NOT EXISTS training_jobs_model ON training_jobs (model_id, seq);
