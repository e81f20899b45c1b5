-- Earlier versions could store a non-finite metric (a mean that overflowed, a diverged loss) as
-- JSON null, which then made the row unreadable. Keep only the numbers of every metrics object.
UPDATE checkpoints
SET metrics = (SELECT json_group_object(key, value) FROM json_each(checkpoints.metrics)
               WHERE type IN ('integer', 'real'))
WHERE EXISTS (SELECT 1 FROM json_each(checkpoints.metrics) WHERE type NOT IN ('integer', 'real'));

UPDATE trajectory_logs
SET metrics = (SELECT json_group_object(key, value) FROM json_each(trajectory_logs.metrics)
               WHERE type IN ('integer', 'real'))
WHERE EXISTS (SELECT 1 FROM json_each(trajectory_logs.metrics) WHERE type NOT IN ('integer', 'real'));
