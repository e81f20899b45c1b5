//! A model's history as curves over training steps: the metrics of its trajectory logs, and the
//! per-job means of its `gradient_step` metrics (what ART's `train()` reports), downsampled to a
//! bounded number of points so that a page stays fast with thousands of steps.

use crate::records::{JobStatus, LogEntry};
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
/// mean of their steps and the time of the last one. Without downsampling each bucket is one
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

/// At most `max` buckets (at least 1) of consecutive points, ordered by step then time; each
/// bucket holds `ceil(n / max)` points or, the last, fewer. Non-finite values never reach here
/// (the store keeps finite metrics only) and are skipped if they do.
pub fn downsample(points: &[Point], max: usize) -> Vec<Bucket> {
    let mut sorted: Vec<Point> = points.iter().copied().filter(|p| p.value.is_finite()).collect();
    sorted.sort_by_key(|p| (p.step, p.time));
    if sorted.is_empty() {
        return Vec::new();
    }
    let per = sorted.len().div_ceil(max.max(1));
    sorted
        .chunks(per)
        .map(|chunk| {
            let n = chunk.len() as f64;
            Bucket {
                step: chunk.iter().map(|p| p.step as f64).sum::<f64>() / n,
                time: chunk.iter().map(|p| p.time).max().unwrap_or(0),
                value: chunk.iter().map(|p| p.value).sum::<f64>() / n,
                min: chunk.iter().map(|p| p.value).fold(f64::INFINITY, f64::min),
                max: chunk.iter().map(|p| p.value).fold(f64::NEG_INFINITY, f64::max),
                count: chunk.len() as u64,
            }
        })
        .collect()
}

/// Every metric of every log as a series keyed as stored (`val/reward`, `train/reward_std_dev`,
/// `val/data/step_num_trajectories`, ...), at the log's step.
pub fn log_series(logs: &[LogEntry]) -> BTreeMap<String, Vec<Point>> {
    let mut out: BTreeMap<String, Vec<Point>> = BTreeMap::new();
    for log in logs {
        for (key, value) in &log.metrics {
            out.entry(key.clone()).or_default().push(Point { step: log.step, time: log.created_at, value: *value });
        }
    }
    out
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

/// The mean of each numeric `gradient_step` metric over each job, keyed `training/{name}`, at
/// the step the job produced. A job still running is placed at `latest_step + 1`, the step it
/// will produce, so its curve grows live; failed and cancelled jobs produced no step and are
/// left out.
pub fn training_series(rows: &[GradientStepRow], latest_step: i64) -> BTreeMap<String, Vec<Point>> {
    // (job, metric) -> (sum, count, last time, step)
    let mut per_job: BTreeMap<(i64, String), (f64, u64, i64, i64)> = BTreeMap::new();
    for row in rows {
        let step = match (row.job_status, row.job_step) {
            (JobStatus::Succeeded, Some(step)) => step,
            (JobStatus::Running, _) => latest_step + 1,
            _ => continue,
        };
        let Some(obj) = row.data.as_object() else { continue };
        for (name, v) in obj {
            let Some(x) = v.as_f64().filter(|x| x.is_finite()) else { continue };
            let e = per_job.entry((row.job_seq, name.clone())).or_insert((0.0, 0, row.created_at, step));
            e.0 += x;
            e.1 += 1;
            e.2 = e.2.max(row.created_at);
        }
    }
    let mut out: BTreeMap<String, Vec<Point>> = BTreeMap::new();
    for ((_, name), (sum, n, time, step)) in per_job {
        out.entry(format!("training/{name}")).or_default().push(Point { step, time, value: sum / n as f64 });
    }
    out
}

#[cfg(test)]
mod tests {
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
        // 5 points into at most 2 buckets: 3 and 2.
        let pts = [p(1, 1.0), p(2, 2.0), p(3, 6.0), p(4, -1.0), p(5, 1.0)];
        let b = downsample(&pts, 2);
        assert_eq!(b.len(), 2);
        assert_eq!((b[0].step, b[0].value, b[0].min, b[0].max, b[0].count, b[0].time), (2.0, 3.0, 1.0, 6.0, 3, 30));
        assert_eq!((b[1].step, b[1].value, b[1].min, b[1].max, b[1].count), (4.5, 0.0, -1.0, 1.0, 2));
        assert_eq!(downsample(&pts, 0).len(), 1);
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
        let s = log_series(&[log(0, 0.25), log(1, 0.75)]);
        assert_eq!(
            s["val/reward"],
            vec![Point { step: 0, time: 100, value: 0.25 }, Point { step: 1, time: 101, value: 0.75 }]
        );
        assert_eq!(s["val/reward_std_dev"].len(), 2);
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
        let s = training_series(&rows, 1);
        assert_eq!(s.keys().collect::<Vec<_>>(), ["training/loss"]);
        assert_eq!(
            s["training/loss"],
            vec![Point { step: 1, time: 11, value: 3.0 }, Point { step: 2, time: 30, value: 1.0 }]
        );
    }
}
