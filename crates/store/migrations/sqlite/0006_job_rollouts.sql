-- What a training job's rollouts looked like, for people rather than the trainer: the metrics of
-- its groups (ART's `train/reward`, ...) as a JSON object, and the groups as submitted (the
-- trainer reads the tokenized `trajectory_groups`; the dashboard's trajectory browser reads
-- these). Both are NULL for SFT jobs and for jobs created before this migration.
ALTER TABLE training_jobs ADD COLUMN rollout_metrics TEXT;
ALTER TABLE training_jobs ADD COLUMN rollout_groups TEXT;
