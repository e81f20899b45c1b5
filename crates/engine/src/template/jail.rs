//! Request-supplied chat templates run in a child process with bounded memory and time.
//!
//! A template is a program: minijinja bounds its instructions (fuel) and tandem its output, but one
//! instruction can still allocate without limit (`"x" * 10**8` is allowed by minijinja, and
//! `{% set s = s ~ s %}` in a loop doubles a string per iteration). A model's own template is
//! trusted and renders in-process; a template from a request renders in `tandem
//! __render-template`, which sets its own memory and CPU limits before reading the job from
//! stdin. A child that runs out of memory or time dies alone, and the request gets a 400. At most
//! [`TemplateJail::concurrency`] children run at once; the rest wait their turn.

use super::{ChatTemplate, RenderInputs, TemplateError};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// What the child renders.
#[derive(Serialize, Deserialize)]
pub struct JailJob {
    pub source: String,
    pub messages: Vec<Value>,
    pub inputs: RenderInputs,
}

/// What the child answers on stdout.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JailAnswer {
    Rendered(String),
    Syntax(String),
    Render(String),
    Invalid(String),
}

pub struct TemplateJail {
    /// The program and arguments that run [`serve_one`] (the tandem binary's hidden subcommand).
    pub program: PathBuf,
    pub args: Vec<String>,
    /// Wall-clock limit of one render, process start included.
    pub timeout: Duration,
    /// Children running at once; one entity may hold all but one of them (so another entity's
    /// template never waits behind a flood from one), or the only one when there is one.
    pub concurrency: usize,
    /// Renders running, in total and per entity.
    running: Mutex<(usize, HashMap<String, usize>)>,
    freed: Condvar,
}

/// Memory one jailed render may use (the child's data limit).
pub const JAIL_MEMORY_BYTES: u64 = 512 << 20;
/// CPU seconds one jailed render may use (the child's CPU limit; the wall clock is `timeout`).
pub const JAIL_CPU_SECONDS: u64 = 10;

impl TemplateJail {
    pub fn new(program: PathBuf, args: Vec<String>) -> Self {
        TemplateJail {
            program,
            args,
            timeout: Duration::from_secs(10),
            concurrency: 2,
            running: Mutex::new((0, HashMap::new())),
            freed: Condvar::new(),
        }
    }

    /// Renders in a child process for `tenant`. Blocking: call it from a blocking thread.
    pub fn render(&self, job: &JailJob, tenant: &str) -> Result<String, TemplateError> {
        let _slot = self.slot(tenant)?;
        let input = serde_json::to_vec(job).map_err(|e| TemplateError::Render(e.to_string()))?;
        let unavailable = |e: std::io::Error| {
            tracing::error!(error = %e, "cannot run the chat-template jail");
            TemplateError::Render("the chat template could not be rendered (the server logged why)".into())
        };
        let mut child = Command::new(&self.program)
            .args(&self.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(unavailable)?;
        let mut stdin = child.stdin.take().expect("piped stdin");
        let mut stdout = child.stdout.take().expect("piped stdout");
        // Writer and reader on their own threads, so that neither pipe can block the other.
        let writer = std::thread::spawn(move || {
            let _ = stdin.write_all(&input);
        });
        let reader = std::thread::spawn(move || {
            let mut out = Vec::new();
            // The answer is the rendered text (capped in the child) plus its JSON quoting.
            let _ = (&mut stdout).take(3 * super::MAX_OUTPUT as u64 + 4096).read_to_end(&mut out);
            out
        });
        let deadline = Instant::now() + self.timeout;
        let status = loop {
            match child.try_wait().map_err(unavailable)? {
                Some(status) => break Some(status),
                None if Instant::now() >= deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
                None => std::thread::sleep(Duration::from_millis(2)),
            }
        };
        let _ = writer.join();
        let out = reader.join().unwrap_or_default();
        let Some(status) = status else {
            return Err(TemplateError::Render(format!(
                "the chat template ran longer than {} s and was stopped",
                self.timeout.as_secs()
            )));
        };
        match serde_json::from_slice::<JailAnswer>(&out) {
            Ok(answer) if status.success() => answer.into_result(),
            _ => Err(TemplateError::Render(format!(
                "the chat template was stopped: it needed more than {} MiB of memory or {JAIL_CPU_SECONDS} s of CPU",
                JAIL_MEMORY_BYTES >> 20
            ))),
        }
    }

    /// Waits (up to the timeout) for one of the `concurrency` slots that `tenant` may take.
    fn slot(&self, tenant: &str) -> Result<Slot<'_>, TemplateError> {
        let total = self.concurrency.max(1);
        let per_tenant = total.saturating_sub(1).max(1);
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let deadline = Instant::now() + self.timeout;
        while running.0 >= total || running.1.get(tenant).copied().unwrap_or(0) >= per_tenant {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(TemplateError::Render("too many chat templates are rendering; retry shortly".into()));
            }
            running = self.freed.wait_timeout(running, left).unwrap_or_else(|e| e.into_inner()).0;
        }
        running.0 += 1;
        *running.1.entry(tenant.to_string()).or_default() += 1;
        Ok(Slot(self, tenant.to_string()))
    }

    /// Renders running now for `tenant` (tests).
    #[doc(hidden)]
    pub fn running_for(&self, tenant: &str) -> usize {
        self.running.lock().unwrap_or_else(|e| e.into_inner()).1.get(tenant).copied().unwrap_or(0)
    }
}

struct Slot<'a>(&'a TemplateJail, String);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut running = self.0.running.lock().unwrap_or_else(|e| e.into_inner());
        running.0 -= 1;
        if let Some(n) = running.1.get_mut(&self.1) {
            *n -= 1;
            if *n == 0 {
                running.1.remove(&self.1);
            }
        }
        drop(running);
        // Every waiter re-checks: the freed place may be one only another entity may take.
        self.0.freed.notify_all();
    }
}

impl JailAnswer {
    fn into_result(self) -> Result<String, TemplateError> {
        match self {
            JailAnswer::Rendered(text) => Ok(text),
            JailAnswer::Syntax(m) => Err(TemplateError::Syntax(m)),
            JailAnswer::Render(m) => Err(TemplateError::Render(m)),
            JailAnswer::Invalid(m) => Err(TemplateError::Invalid(m)),
        }
    }
}

/// The child's side: reads one [`JailJob`] from `input`, writes one [`JailAnswer`] to `output`.
/// The caller has already limited the process's memory and CPU.
pub fn serve_one(input: impl Read, mut output: impl Write) -> std::io::Result<()> {
    let job: JailJob = serde_json::from_reader(input).map_err(std::io::Error::other)?;
    let answer = match ChatTemplate::new(&job.source).and_then(|t| t.render(&job.messages, &job.inputs)) {
        Ok(text) => JailAnswer::Rendered(text),
        Err(TemplateError::Syntax(m)) => JailAnswer::Syntax(m),
        Err(TemplateError::Render(m)) => JailAnswer::Render(m),
        Err(TemplateError::Invalid(m)) => JailAnswer::Invalid(m),
    };
    serde_json::to_writer(&mut output, &answer).map_err(std::io::Error::other)?;
    output.flush()
}

#[cfg(test)]
mod slot_tests {
    use super::*;

    /// One entity may hold all places but one: a flood of request templates from it leaves a
    /// place for anyone else's.
    #[test]
    fn one_entity_never_holds_every_place() {
        let mut jail = TemplateJail::new(PathBuf::from("/nonexistent"), Vec::new());
        jail.timeout = Duration::from_millis(30);
        let first = jail.slot("a").unwrap();
        assert!(jail.slot("a").is_err(), "a second place for the same entity waits, then gives up");
        let other = jail.slot("b").unwrap();
        assert_eq!((jail.running_for("a"), jail.running_for("b")), (1, 1));
        assert!(jail.slot("c").is_err(), "both places taken");
        drop(first);
        let again = jail.slot("a").unwrap();
        drop((again, other));
        assert_eq!(jail.running_for("a") + jail.running_for("b"), 0);
        // With a single place, it is first come, first served.
        jail.concurrency = 1;
        let only = jail.slot("a").unwrap();
        assert!(jail.slot("b").is_err());
        drop(only);
        assert!(jail.slot("b").is_ok());
    }
}
