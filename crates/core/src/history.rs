//! A model's history as curves over training steps: the metrics of its trajectory logs, and the
//! per-job means of its `gradient_step` metrics (what ART's `train()` reports), downsampled to a
//! bounded number of points so that a page stays fast with thousands of steps.

use crate::records::{Job, JobStatus, LogEntry};
use serde_json::Value;
use std::collections::BTreeMap;

/// One observation: at a training step (the step a log was written at, or the step a job
/// produced), when, and its value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    pub step: i64,
    /// Unix milliseconds.
    pub time: i64,
    pub value: f64,
}

/// What a curve shows for a run of consecutive points: their mean, extremes and count, at the
/// mean of their steps and the latest of their times. Without downsampling each bucket is one
/// point (`min == max == value`, `count == 1`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bucket {
    pub step: f64,
    pub time: i64,
    pub value: f64,
    pub min: f64,
    pub max: f64,
    pub count: u64,
}

/// At most `max` buckets (at least 1) of consecutive points, ordered by step then time: bucket
/// `i` of `b = min(n, max)` holds points `[i*n/b, (i+1)*n/b)`, so every bucket holds
/// `floor(n/b)` or `ceil(n/b)` points and the budget is used whole. Non-finite values never
/// reach here (the store keeps finite metrics only) and are skipped if they do.
pub fn downsample(points: &[Point], max: usize) -> Vec<Bucket> {
    let mut sorted: Vec<Point> = points.iter().copied().filter(|p| p.value.is_finite()).collect();
    sorted.sort_by_key(|p| (p.step, p.time));
    let n = sorted.len();
    let b = n.min(max.max(1));
    (0..b)
        .map(|i| {
            let chunk = &sorted[i * n / b..(i + 1) * n / b];
            let k = chunk.len() as f64;
            Bucket {
                step: chunk.iter().map(|p| p.step as f64).sum::<f64>() / k,
                time: chunk.iter().map(|p| p.time).max().unwrap_or(0),
                value: chunk.iter().map(|p| p.value).sum::<f64>() / k,
                min: chunk.iter().map(|p| p.value).fold(f64::INFINITY, f64::min),
                max: chunk.iter().map(|p| p.value).fold(f64::NEG_INFINITY, f64::max),
                count: chunk.len() as u64,
            }
        })
        .collect()
}

/// Most series one history holds, and most observations over all of them: a tenant that logs
/// millions of distinct metric keys gets a truncated history, not a server out of memory.
pub const MAX_SERIES: usize = 256;
pub const MAX_OBSERVATIONS: usize = 2_000_000;

/// Series by (source, key), bounded by [`MAX_SERIES`] and [`MAX_OBSERVATIONS`]. The source
/// (`logs` or `training`) is part of the key: a log split named `training` stays its own series.
#[derive(Debug, Default)]
pub struct Series {
    pub by_key: BTreeMap<(&'static str, String), Vec<Point>>,
    observations: usize,
    /// Whether a point was left out for a bound.
    pub truncated: bool,
}

impl Series {
    pub fn add(&mut self, source: &'static str, key: &str, point: Point) {
        if self.observations >= MAX_OBSERVATIONS {
            self.truncated = true;
            return;
        }
        let full = self.by_key.len() >= MAX_SERIES;
        match self.by_key.get_mut(&(source, key.to_string())) {
            Some(points) => points.push(point),
            None if !full => {
                self.by_key.insert((source, key.to_string()), vec![point]);
            }
            None => {
                self.truncated = true;
                return;
            }
        }
        self.observations += 1;
    }
}

/// Every metric of these logs into `out`, keyed as stored (`val/reward`,
/// `train/reward_std_dev`, `val/data/step_num_trajectories`, ...), at the log's step.
pub fn add_logs(out: &mut Series, logs: &[LogEntry]) {
    for log in logs {
        for (key, value) in &log.metrics {
            out.add("logs", key, Point { step: log.step, time: log.created_at, value: *value });
        }
    }
}

/// The step a job's curves are placed at: the step it produced once it succeeded, the step it
/// will produce (`latest_step + 1`) while it runs, so its points appear live; failed, cancelled
/// and queued jobs produced nothing yet and are left out.
fn job_step(status: JobStatus, step: Option<i64>, latest_step: i64) -> Option<i64> {
    match (status, step) {
        (JobStatus::Succeeded, Some(step)) => Some(step),
        (JobStatus::Running, _) => Some(latest_step + 1),
        _ => None,
    }
}

/// Each RL job's rollout metrics (`train/reward`, ... computed from its groups when it was
/// created), into `out` under source `jobs`, at the job's step (see [`job_step`]) and creation
/// time. This is the reward curve of a client that trains without logging (ART 0.5.23 never
/// calls `/log`).
pub fn add_rollouts(out: &mut Series, jobs: &[Job], latest_step: i64) {
    for job in jobs {
        let Some(step) = job_step(job.status, job.step, latest_step) else { continue };
        for (key, value) in &job.rollout_metrics {
            out.add("jobs", key, Point { step, time: job.created_at, value: *value });
        }
    }
}

/// One `gradient_step` event of a model's job, with what the curve needs of its job.
#[derive(Debug, Clone, PartialEq)]
pub struct GradientStepRow {
    /// The job's position among the model's jobs (jobs of one model run one at a time).
    pub job_seq: i64,
    pub job_status: JobStatus,
    /// The step the job produced, once it succeeded.
    pub job_step: Option<i64>,
    pub data: Value,
    pub created_at: i64,
}

/// The mean of each numeric `gradient_step` metric over each job, into `out`, keyed
/// `training/{name}`, at the step the job produced. A job still running is placed at `latest_step + 1`, the step it
/// will produce, so its curve grows live; failed and cancelled jobs produced no step and are
/// left out.
pub fn add_training(out: &mut Series, rows: &[GradientStepRow], latest_step: i64) {
    // (job, metric) -> (sum, count, last time, step)
    let mut per_job: BTreeMap<(i64, &str), (f64, u64, i64, i64)> = BTreeMap::new();
    for row in rows {
        let Some(step) = job_step(row.job_status, row.job_step, latest_step) else { continue };
        let Some(obj) = row.data.as_object() else { continue };
        for (name, v) in obj {
            let Some(x) = v.as_f64().filter(|x| x.is_finite()) else { continue };
            let e = per_job.entry((row.job_seq, name.as_str())).or_insert((0.0, 0, row.created_at, step));
            e.0 += x;
            e.1 += 1;
            e.2 = e.2.max(row.created_at);
        }
    }
    for ((_, name), (sum, n, time, step)) in per_job {
        out.add("training", &format!("training/{name}"), Point { step, time, value: sum / n as f64 });
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn series_are_bounded() {
        let mut s = Series::default();
        for i in 0..MAX_SERIES + 10 {
            s.add("logs", &format!("k{i}"), Point { step: 0, time: 0, value: 1.0 });
        }
        assert_eq!((s.by_key.len(), s.truncated), (MAX_SERIES, true));
        s.add("logs", "k0", Point { step: 1, time: 0, value: 1.0 });
        assert_eq!(s.by_key[&("logs", "k0".to_string())].len(), 2, "a known key still takes points");
    }

    use super::*;
    use serde_json::json;

    fn p(step: i64, value: f64) -> Point {
        Point { step, time: step * 10, value }
    }

    #[test]
    fn few_points_are_kept_as_they_are() {
        let b = downsample(&[p(2, 1.0), p(1, 3.0)], 10);
        assert_eq!(b.len(), 2);
        assert_eq!((b[0].step, b[0].value, b[0].min, b[0].max, b[0].count), (1.0, 3.0, 3.0, 3.0, 1));
        assert_eq!((b[1].step, b[1].time), (2.0, 20));
    }

    #[test]
    fn many_points_become_bucket_means_with_their_extremes() {
        // 5 points into 2 buckets: [0, 2) and [2, 5).
        let pts = [p(1, 1.0), p(2, 2.0), p(3, 6.0), p(4, -1.0), p(5, 1.0)];
        let b = downsample(&pts, 2);
        assert_eq!(b.len(), 2);
        assert_eq!((b[0].step, b[0].value, b[0].min, b[0].max, b[0].count, b[0].time), (1.5, 1.5, 1.0, 2.0, 2, 20));
        assert_eq!((b[1].step, b[1].value, b[1].min, b[1].max, b[1].count), (4.0, 2.0, -1.0, 6.0, 3));
        assert_eq!(downsample(&pts, 0).len(), 1);
        // The budget is used whole: 401 points into 400 buckets, not 201.
        let many: Vec<Point> = (0..401).map(|i| p(i, 1.0)).collect();
        let b = downsample(&many, 400);
        assert_eq!((b.len(), b.iter().map(|x| x.count).sum::<u64>()), (400, 401));
        assert!(downsample(&[Point { step: 1, time: 0, value: f64::NAN }], 5).is_empty());
    }

    #[test]
    fn logs_give_one_series_per_metric() {
        let log = |step, r: f64| LogEntry {
            id: uuid::Uuid::nil(),
            model_id: uuid::Uuid::nil(),
            split: "val".into(),
            step,
            metrics: BTreeMap::from([("val/reward".to_string(), r), ("val/reward_std_dev".to_string(), 0.5)]),
            num_groups: 1,
            num_trajectories: 2,
            created_at: 100 + step,
        };
        let mut s = Series::default();
        add_logs(&mut s, &[log(0, 0.25), log(1, 0.75)]);
        assert_eq!(
            s.by_key[&("logs", "val/reward".to_string())],
            vec![Point { step: 0, time: 100, value: 0.25 }, Point { step: 1, time: 101, value: 0.75 }]
        );
        assert_eq!(s.by_key[&("logs", "val/reward_std_dev".to_string())].len(), 2);
        assert!(!s.truncated);
    }

    #[test]
    fn jobs_give_the_mean_of_their_gradient_steps_at_the_step_they_made() {
        let row = |job_seq, job_status, job_step, loss: f64, at| GradientStepRow {
            job_seq,
            job_status,
            job_step,
            data: json!({"loss": loss, "note": "text is skipped"}),
            created_at: at,
        };
        let rows = [
            row(1, JobStatus::Succeeded, Some(1), 2.0, 10),
            row(1, JobStatus::Succeeded, Some(1), 4.0, 11),
            row(2, JobStatus::Failed, None, 9.0, 20),
            row(3, JobStatus::Running, None, 1.0, 30),
        ];
        let mut s = Series::default();
        add_training(&mut s, &rows, 1);
        let key = ("training", "training/loss".to_string());
        assert_eq!(s.by_key.keys().collect::<Vec<_>>(), [&key]);
        assert_eq!(
            s.by_key[&key],
            vec![Point { step: 1, time: 11, value: 3.0 }, Point { step: 2, time: 30, value: 1.0 }]
        );
    }

    #[test]
    fn rollout_metrics_sit_at_the_step_their_job_made_or_will_make() {
        let job = |status, step, reward: f64, at| Job {
            id: uuid::Uuid::nil(),
            model_id: uuid::Uuid::nil(),
            kind: crate::records::JobKind::Rl,
            status,
            step,
            error_message: None,
            cancel_requested: false,
            attempts: 1,
            created_at: at,
            started_at: None,
            finished_at: None,
            rollout_metrics: BTreeMap::from([("train/reward".to_string(), reward)]),
        };
        let jobs = [
            job(JobStatus::Succeeded, Some(1), 0.25, 10),
            job(JobStatus::Cancelled, None, 9.0, 15),
            job(JobStatus::Succeeded, Some(2), 0.5, 20),
            job(JobStatus::Queued, None, 9.0, 25),
            job(JobStatus::Running, None, 0.75, 30),
        ];
        let mut s = Series::default();
        add_rollouts(&mut s, &jobs, 2);
        assert_eq!(
            s.by_key[&("jobs", "train/reward".to_string())],
            vec![
                Point { step: 1, time: 10, value: 0.25 },
                Point { step: 2, time: 20, value: 0.5 },
                Point { step: 3, time: 30, value: 0.75 }
            ]
        );
    }
}
